from xbench.findings import FINDINGS, PAPER_CLASSES, SPELLINGS, check_classes, finding_key

import pytest


def test_paper_has_55_dataset_class_pairs():
    assert sum(len(v) for v in PAPER_CLASSES.values()) == 55
    assert {k: len(v) for k, v in PAPER_CLASSES.items()} == {
        "rsna": 1, "siim": 1, "covid_rural": 1, "chestx_det10": 10, "chexlocalize": 13, "chestxray14": 8, "vindr": 21,
    }


def test_every_key_is_in_the_one_table():
    for dataset, classes in PAPER_CLASSES.items():
        assert set(classes) <= set(SPELLINGS[dataset].values()), dataset
        for key in classes:
            assert key in FINDINGS
    for spellings in SPELLINGS.values():
        assert set(spellings.values()) <= set(FINDINGS)
    shorts = [f.short for f in FINDINGS.values()]
    assert len(shorts) == len(set(shorts))


def test_raw_spellings_of_the_quirky_files():
    assert finding_key("chestxray14", "Infiltrate") == finding_key("chestxray14", "Infiltration") == "infiltration"
    assert finding_key("chexlocalize", "Airspace Opacity") == finding_key("chexlocalize", "Lung Opacity") == "lung_opacity"
    assert finding_key("vindr", "Pleural effusion") == finding_key("chestx_det10", "Effusion") == "pleural_effusion"
    assert "edema" not in PAPER_CLASSES["vindr"]


def test_unknown_spelling_and_key_errors_name_the_fix():
    with pytest.raises(ValueError, match=r"'Efusion'.*test.json.*findings.py"):
        finding_key("chestx_det10", "Efusion", source="test.json")
    with pytest.raises(ValueError, match="not a finding key"):
        check_classes(["pneumonitis"])
    with pytest.raises(ValueError, match="not annotated in this dataset"):
        check_classes(["cardiomegaly"], allowed=PAPER_CLASSES["chestx_det10"])
