"""The catalogue cannot drift: every model and dataset class XBench ships is found in its package,
has a config under ``lightning_configs/``, is listed by ``python -m xbench.test --help`` and resolves
by its short name; abstract bases are none of these."""

from __future__ import annotations

import pytest
import yaml

from conftest import CONFIGS
from xbench import catalog
from xbench.test import main

ABSTRACT_BASES = ("xbench.models.base.XBenchModel", "xbench.models.clip.OpenClipDualEncoder",
                  "xbench.models.kad.QueryDecoderModel", "xbench.data.base.XBenchDataModule")


def class_path(cls: type) -> str:
    return f"{cls.__module__}.{cls.__qualname__}"


def config_class_paths(folder: str) -> set[str]:
    """The class paths the configs of ``lightning_configs/<folder>`` name (an overlay names none: it
    sets options of the class before it)."""
    key = {"models": "model", "data": "data"}[folder]
    sections = [yaml.safe_load(path.read_text())[key] for path in (CONFIGS / folder).glob("*.yaml")]
    return {section["class_path"] for section in sections if "class_path" in section}


@pytest.mark.parametrize(("folder", "found"), [("models", catalog.models), ("data", catalog.datasets)])
def test_every_config_names_a_catalogued_class_and_every_class_has_a_config(folder, found):
    shipped = {class_path(cls) for cls in found()}
    configured = config_class_paths(folder)
    assert configured <= shipped, f"configs name classes the catalogue lacks: {sorted(configured - shipped)}"
    assert shipped <= configured, f"classes without a config in lightning_configs/{folder}: {sorted(shipped - configured)}"


def test_the_catalogue_holds_the_models_the_hand_kept_list_missed_and_no_abstract_base():
    models = {cls.__name__ for cls in catalog.models()}
    assert {"CheXzero", "BioViL", "BioViLT", "GLoRIA", "PrecomputedSaliency", "MedKLIP", "Oracle"} <= models
    paths = {class_path(cls) for cls in (*catalog.models(), *catalog.datasets())}
    assert not paths & set(ABSTRACT_BASES)


def test_help_lists_every_shipped_class_and_no_abstract_base(capsys):
    with pytest.raises(SystemExit) as exit_info:
        main(["--help"])
    assert exit_info.value.code == 0
    listed = "".join(capsys.readouterr().out.split())  # the help wraps long lists at any comma
    for cls in (*catalog.models(), *catalog.datasets()):
        assert class_path(cls) in listed, class_path(cls)
    for base in ABSTRACT_BASES:
        assert f"{base}," not in listed and f"{base})" not in listed, base


@pytest.mark.parametrize("kind", ["model", "data"])
def test_every_shipped_class_resolves_by_its_short_name(kind, capsys):
    """``--model CheXzero`` as ``--model MedKLIP``: the name alone finds the class."""
    for cls in catalog.models() if kind == "model" else catalog.datasets():
        other = ["--data", "Phantom"] if kind == "model" else ["--model", "Oracle"]
        with pytest.raises(SystemExit) as exit_info:
            main([f"--{kind}", cls.__name__, *other, "--print_config"])
        assert exit_info.value.code == 0
        config = yaml.safe_load(capsys.readouterr().out)
        assert config[kind]["class_path"] == class_path(cls)


#: Configs of one class that reads many layouts of saved outputs: their runs share its name.
SAVED_OUTPUTS = "xbench.models.precomputed.PrecomputedSaliency"


@pytest.mark.parametrize("folder", ["models", "data"])
def test_each_config_is_named_as_its_model_or_dataset(folder):
    """One spelling everywhere: a suite lists a pair by its configs' names, and the run's folder,
    ``metrics.json``, W&B and a reference's rows by the model's and the dataset's ``name``; for
    every config XBench ships, the two are one (``random``, not ``randomsaliency``)."""
    from pydoc import locate

    key = {"models": "model", "data": "data"}[folder]
    for path in sorted((CONFIGS / folder).glob("*.yaml")):
        section = yaml.safe_load(path.read_text())[key]
        if "class_path" not in section or section["class_path"] == SAVED_OUTPUTS:
            continue
        cls = locate(section["class_path"])
        name = (section.get("init_args") or {}).get("name") or (cls.name if folder == "data" else cls.model_name())
        assert name == path.stem, (path, name)
