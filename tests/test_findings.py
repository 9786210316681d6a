from xbench.findings import FINDINGS, PAPER_CLASSES, SPELLINGS, check_classes, finding_key

import pytest

import xbench.findings as findings_module


@pytest.fixture(autouse=True)
def restore_the_vocabulary():
    """The vocabulary is process-wide (a user's dataset registers into it): tests that register
    their own leave it as they found it, so later tests see the paper's table only."""
    tables = ("FINDINGS", "SPELLINGS", "DEFAULT_CLASSES", "DATASET_NAMES")
    saved = {name: dict(getattr(findings_module, name)) for name in tables}
    yield
    for name, table in saved.items():
        current = getattr(findings_module, name)
        current.clear()
        current.update(table)


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


def test_a_dataset_states_its_own_vocabulary_without_editing_findings():
    from xbench.data.base import XBenchDataModule
    from xbench.findings import DATASET_NAMES, Finding, dataset_name, display_name, short_name

    class Spots(XBenchDataModule):
        name = "spots_test"
        display_name = "Spots"
        findings = (Finding("spot", "Spot", "SPOT"),)
        spellings = {"spot": "spot", "Spot": "spot", "nodule": "nodule"}

    assert Spots.default_classes() == ("spot", "nodule")
    assert finding_key("spots_test", "Spot") == "spot"
    assert display_name("spot") == "Spot" and short_name("spot") == "SPOT"
    assert dataset_name("spots_test") == "Spots" == DATASET_NAMES["spots_test"]
    assert check_classes(["spot"], allowed=Spots.supported_classes()) == ["spot"]
    assert PAPER_CLASSES.keys() == {"rsna", "siim", "covid_rural", "chestx_det10", "chexlocalize", "chestxray14", "vindr"}


def test_registering_findings_in_one_call_and_its_conflicts():
    from xbench.findings import Finding, default_classes_of, register

    register("dots_test", {"Dot": "dot", "Mass": "mass"}, findings=[Finding("dot", "Dot", "DOT")], classes=["dot"])
    register("dots_test", {"Dot": "dot", "Mass": "mass"}, findings=[Finding("dot", "Dot", "DOT")], classes=["dot"])
    assert default_classes_of("dots_test") == ("dot",)
    with pytest.raises(ValueError, match="taken by another vocabulary"):
        register("dots_test", {"Dot": "dot"})
    with pytest.raises(ValueError, match="already"):
        register("other_test", {"Mass": "mass"}, findings=[Finding("mass", "Tumour", "MASS")])
    with pytest.raises(ValueError, match="short name 'EFF'"):
        register("other_test", {"Blob": "blob"}, findings=[Finding("blob", "Blob", "EFF")])
    with pytest.raises(ValueError, match=r"not findings: \['blob'\].*declare them in `findings`"):
        register("other_test", {"Blob": "blob"})
    assert "other_test" not in SPELLINGS and "blob" not in FINDINGS


def test_an_unknown_dataset_name_says_how_to_declare_a_vocabulary():
    from xbench.data.base import XBenchDataModule

    class Nameless(XBenchDataModule):
        name = "nameless_test"

        def index(self):
            return []

    with pytest.raises(LookupError, match=r"'nameless_test' has no vocabulary.*set `spellings ="):
        Nameless(root=".")
    with pytest.raises(LookupError, match="no vocabulary"):
        finding_key("nameless_test", "x")
