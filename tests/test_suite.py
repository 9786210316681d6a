"""The suite: skips what is missing or done, goes on after a pair that fails."""

from __future__ import annotations

import json
import textwrap
from pathlib import Path

import pytest
import yaml

from conftest import CONFIGS, only_folder
from xbench.suite import load_suite, main, plan

REPO = Path(__file__).resolve().parents[1]

USER_MODELS = '''
from xbench.models.baselines import CentrePrior
from xbench.models.base import XBenchModel


class NeedsWeights(XBenchModel):
    """Reads its weights from checkpoint_dir (never reached in these tests)."""

    def __init__(self, checkpoint_dir: str = "checkpoints/needsweights", **kwargs):
        super().__init__(**kwargs)
        self.checkpoint_dir = checkpoint_dir


class Broken(CentrePrior):
    def forward(self, image):
        raise RuntimeError("boom: this model always fails")
'''


@pytest.fixture
def suite_dir(tmp_path, phantom_root, monkeypatch) -> Path:
    """A suite of three models (one without weights, one that raises, one baseline) on the phantom
    and on a dataset whose folder is missing; user models importable here and in the runs."""
    (tmp_path / "user_models.py").write_text(textwrap.dedent(USER_MODELS))
    monkeypatch.syspath_prepend(str(tmp_path))
    monkeypatch.setenv("PYTHONPATH", f"{tmp_path}:{REPO}")
    monkeypatch.chdir(tmp_path)
    for name in ("NeedsWeights", "Broken"):
        (tmp_path / f"{name.lower()}.yaml").write_text(yaml.safe_dump({"model": {"class_path": f"user_models.{name}"}}))
    suite = {
        "results_dir": "results",
        "settings": {"data.image_size": 32, "data.batch_size": 4, "data.num_workers": 0,
                     "trainer.enable_progress_bar": False, "trainer.logger": False},
        "models": ["needsweights.yaml", "broken.yaml", str(CONFIGS / "models" / "random.yaml")],
        "datasets": [
            {"config": str(CONFIGS / "data" / "phantom.yaml"), "settings": {"data.root": str(phantom_root)}},
            {"config": str(CONFIGS / "data" / "chestx_det10.yaml"), "settings": {"data.root": "nowhere/det10"}},
            str(tmp_path / "not_yet.yaml"),
        ],
    }
    (tmp_path / "suite.yaml").write_text(yaml.safe_dump(suite, sort_keys=False))
    return tmp_path


def statuses(suite_file: Path, force: bool = False) -> dict[tuple[str, str], tuple[str, str]]:
    return {(p.model.label, p.dataset.label): (p.status, p.detail) for p in plan(load_suite(suite_file), force)}


def test_dry_run_lists_every_pair_with_the_missing_path(suite_dir, capsys):
    assert main(["--config", "suite.yaml", "--dry-run"]) == 0
    found = statuses(suite_dir / "suite.yaml")
    assert found[("needsweights", "phantom")] == (
        "missing", "checkpoint_dir checkpoints/needsweights (see checkpoints/README.md)")
    assert found[("broken", "phantom")] == ("run", "") and found[("random", "phantom")] == ("run", "")
    for model in ("needsweights", "broken", "random"):
        assert found[(model, "not_yet")] == ("missing", f"config {suite_dir / 'not_yet.yaml'}")
    assert found[("broken", "chestx_det10")] == ("missing", "data.root nowhere/det10")
    out = capsys.readouterr().out
    assert "2 of 9 pairs to run" in out and "checkpoints/needsweights" in out and "nowhere/det10" in out
    assert not (suite_dir / "results").exists()

    (suite_dir / "checkpoints" / "needsweights").mkdir(parents=True)
    (suite_dir / "checkpoints" / "needsweights" / "weights.pt").touch()
    assert statuses(suite_dir / "suite.yaml")[("needsweights", "phantom")] == ("run", "")


@pytest.mark.slow  # each pair in a process of its own (per-pair mode) is the point
def test_a_failing_pair_is_reported_and_the_suite_goes_on(suite_dir, capsys):
    assert main(["--config", "suite.yaml", "--mode", "per-pair"]) == 1  # one pair failed, in its own process
    out = capsys.readouterr()
    assert "boom: this model always fails" in out.out  # in the summary table
    folder = only_folder(suite_dir / "results")
    assert folder.name.startswith("random__phantom__")
    config = json.loads((folder / "metrics.json").read_text())["config"]
    assert config["data"]["init_args"]["image_size"] == 32 and config["results"]["folder"] == "results"

    # a re-run skips the pair that has results, unless forced or its settings differ
    found = statuses(suite_dir / "suite.yaml")
    assert found[("random", "phantom")] == ("done", str(Path("results") / folder.name))
    assert found[("broken", "phantom")] == ("run", "")
    assert statuses(suite_dir / "suite.yaml", force=True)[("random", "phantom")] == ("run", "")
    # results another XBench version wrote (another schema) are not this version's: the pair runs again
    payload = json.loads((folder / "metrics.json").read_text())
    (folder / "metrics.json").write_text(json.dumps({**payload, "schema": "xbench.results/1"}))
    with pytest.warns(UserWarning, match="1 results folder.* another XBench version"):
        assert statuses(suite_dir / "suite.yaml")[("random", "phantom")] == ("run", "")
    (folder / "metrics.json").write_text(json.dumps(payload))
    changed = yaml.safe_load((suite_dir / "suite.yaml").read_text())
    changed["models"][2] = {"config": changed["models"][2], "settings": {"model.seed": 7}}
    (suite_dir / "other.yaml").write_text(yaml.safe_dump(changed))
    assert statuses(suite_dir / "other.yaml")[("random", "phantom")] == ("run", "")

    # nor when the earlier run changed a setting this suite leaves at its default
    payload = json.loads((folder / "metrics.json").read_text())
    payload["config"]["data"]["init_args"]["mask_threshold"] = 0.25
    (folder / "metrics.json").write_text(json.dumps(payload))
    assert statuses(suite_dir / "suite.yaml")[("random", "phantom")] == ("run", "")


def test_bad_suite_file_is_a_clear_error(tmp_path):
    (tmp_path / "s.yaml").write_text("model: [a.yaml]\ndatasets: [b.yaml]\n")
    with pytest.raises(ValueError, match=r"unknown keys \['model'\]"):
        load_suite(tmp_path / "s.yaml")


def test_paper_suite_names_the_7x7_benchmark_at_the_paper_settings():
    suite = load_suite(CONFIGS / "suites" / "paper.yaml")
    assert [m.label for m in suite.models] == ["clip", "biomedclip", "medklip", "mavl", "kad", "devide", "carzero"]
    assert [d.label for d in suite.datasets] == [
        "rsna", "siim", "covid_rural", "chestx_det10", "chexlocalize", "chestxray14", "vindr"]
    assert suite.settings == {"data.image_size": 224, "data.batch_size": 8}
    assert all("data.root" in d.settings for d in suite.datasets)


def test_extended_suite_is_the_paper_suite_plus_the_baselines_and_ms_cxr_beside_it():
    paper, extended = (load_suite(CONFIGS / "suites" / f"{name}.yaml") for name in ("paper", "extended"))
    paper_models = [m.label for m in paper.models]
    assert [m.label for m in extended.models] == [*paper_models, "chexzero", "biovil", "biovil_t", "gloria",
                                                  "medsiglip", "xray_clip", "xray_siglip", "radzero"]
    assert extended.datasets[:-1] == paper.datasets and extended.settings == paper.settings
    assert extended.datasets[-1].label == "ms_cxr"
    assert extended.datasets[-1].settings["data.images_root"] == "datasets/mimic-cxr-jpg"


@pytest.mark.slow  # the suite's worker process runs the pair
def test_a_pair_with_an_augment_config_runs_and_is_told_apart_from_its_reference(tmp_path, phantom_root, monkeypatch):
    monkeypatch.chdir(tmp_path)
    monkeypatch.setenv("PYTHONPATH", str(REPO))
    phantom = str(CONFIGS / "data" / "phantom.yaml")
    rotate = str(CONFIGS / "augment" / "rotate10.yaml")
    suite = {
        "results_dir": "results",
        "settings": {"data.image_size": 32, "data.batch_size": 4, "data.num_workers": 0, "data.root": str(phantom_root),
                     "trainer.enable_progress_bar": False, "trainer.logger": False},
        "models": [str(CONFIGS / "models" / "random.yaml")],
        "datasets": [{"config": [phantom, rotate]}],
    }
    (tmp_path / "rotated.yaml").write_text(yaml.safe_dump(suite))
    (pair,) = plan(load_suite(tmp_path / "rotated.yaml"))
    assert pair.dataset.label == "phantom+rotate10" and pair.status == "run"
    assert main(["--config", "rotated.yaml"]) == 0
    folder = only_folder(tmp_path / "results")
    config = json.loads((folder / "metrics.json").read_text())["config"]
    assert config["data"]["init_args"]["augment"] == yaml.safe_load(Path(rotate).read_text())["data"]["init_args"]["augment"]

    # the rotated pair is done; the same model on the unperturbed phantom is not (its results would differ)
    suite["datasets"] = [{"config": [phantom, rotate]}, phantom]
    (tmp_path / "both.yaml").write_text(yaml.safe_dump(suite))
    assert statuses(tmp_path / "both.yaml") == {
        ("random", "phantom+rotate10"): ("done", str(Path("results") / folder.name)),
        ("random", "phantom"): ("run", ""),
    }


def test_robustness_suite_runs_one_model_with_each_ready_pipeline():
    suite = load_suite(CONFIGS / "suites" / "robustness.yaml")
    assert suite.results_dir == Path("results-robustness")
    assert [d.label for d in suite.datasets] == [
        "phantom", "phantom+rotate10", "phantom+brightness_contrast", "phantom+gaussian_noise", "phantom+downscale"]
    pipelines = {p.stem for p in (CONFIGS / "augment").glob("*.yaml")}
    assert {d.configs[-1].stem for d in suite.datasets[1:]} == pipelines
    assert all(path.is_file() for d in suite.datasets for path in d.configs)
