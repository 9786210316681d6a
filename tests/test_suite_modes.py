"""The suite's two modes: one worker per model (the model loaded once) writes what one process per
pair writes; a crash or a dead worker loses only its own pairs."""

from __future__ import annotations

import json
import os
import textwrap
from pathlib import Path

import pytest
import yaml

from conftest import CONFIGS, results_contents, run_args
from xbench.suite import Entry, Pair, load_suite, main, plan, processes, run_arguments
from xbench.test import LoadedModel, run_test
from xbench.test import main as xbench_test

REPO = Path(__file__).resolve().parents[1]

USER_MODELS = '''
import os
import signal
from pathlib import Path

from xbench.models.baselines import RandomSaliency


class Counted(RandomSaliency):
    """Random maps; notes in counts.log each instance made, its one weight load, and each build."""

    def __init__(self, **kwargs):
        super().__init__(**kwargs)
        self.weights = None
        self.note("init")

    def note(self, event):
        with Path("counts.log").open("a") as log:
            log.write(f"{type(self).__name__} {event}\\n")

    def build(self, classes):
        if self.weights is None:
            self.note("load")
            self.weights = "loaded"
        self.note("build " + ",".join(classes))


class Flaky(Counted):
    def infer(self, batch):
        if len(self.classes) == 2:
            raise RuntimeError("flaky: fails on two classes")
        return super().infer(batch)


class Killed(Counted):
    def infer(self, batch):
        if len(self.classes) == 2:
            os.kill(os.getpid(), signal.SIGKILL)
        return super().infer(batch)
'''

PHANTOM = str(CONFIGS / "data" / "phantom.yaml")
TWO_CLASSES = {"config": PHANTOM, "settings": {"data.classes": ["nodule", "mass"]}}
ROTATED = {"config": [PHANTOM, str(CONFIGS / "augment" / "rotate10.yaml")]}
#: The phantom; rotated (the same classes and dataset name, other images); with two of its classes.
DATASETS = [PHANTOM, ROTATED, TWO_CLASSES]


def user_model(name: str) -> str:
    """A config of ``mode_models.<name>``, written into the current folder."""
    Path(f"{name.lower()}.yaml").write_text(yaml.safe_dump({"model": {"class_path": f"mode_models.{name}"}}))
    return f"{name.lower()}.yaml"


def write_suite(folder: Path, phantom_root: Path, models: list, datasets: list = DATASETS) -> None:
    """``suite.yaml`` in ``folder`` (made the current one): ``models`` (names in mode_models, or suite
    entries) on ``datasets``."""
    folder.mkdir(parents=True, exist_ok=True)
    os.chdir(folder)
    suite = {
        "results_dir": "results",
        "settings": {"data.image_size": 32, "data.batch_size": 4, "data.num_workers": 0, "data.root": str(phantom_root),
                     "trainer.enable_progress_bar": False, "trainer.logger": False},
        "models": [user_model(model) if isinstance(model, str) else model for model in models],
        "datasets": datasets,
    }
    Path("suite.yaml").write_text(yaml.safe_dump(suite, sort_keys=False))


@pytest.fixture
def user_models(tmp_path, monkeypatch) -> Path:
    (tmp_path / "mode_models.py").write_text(textwrap.dedent(USER_MODELS))
    monkeypatch.syspath_prepend(str(tmp_path))
    monkeypatch.setenv("PYTHONPATH", f"{tmp_path}:{REPO}")
    return tmp_path


def outcomes(out: str) -> list[tuple[str, str, str, str]]:
    """(model, dataset, status, detail) of each pair, from the printed "Suite results" table."""
    rows: list[list[str]] = []
    for line in out.split("Suite results", 1)[1].splitlines():
        cells = [cell.strip() for cell in line.split("│")[1:-1]]
        if len(cells) != 5:
            continue
        if cells[0]:
            rows.append(cells[1:])
        else:  # the detail folded onto the next line
            rows[-1][3] += " " + cells[4]
    return [tuple(row) for row in rows]


def counts(folder: Path) -> list[str]:
    return (folder / "counts.log").read_text().splitlines()


def run_both_modes(folder: Path, phantom_root: Path, models: list, datasets: list, capsys) -> None:
    """Run the suite per model in ``folder/per-model``, and in ``folder/per-pair`` each pair as per-pair
    mode would, with the same ``xbench.test`` arguments, a fresh model each (in this process: per-pair
    mode's own subprocesses are tested in test_suite.py); every results folder of one equals the
    other's, file by file, all but the time of the run."""
    write_suite(folder / "per-pair", phantom_root, models, datasets)
    suite = load_suite(Path("suite.yaml"))
    for pair in plan(suite):
        xbench_test(run_arguments(suite, pair))
    write_suite(folder / "per-model", phantom_root, models, datasets)
    assert main(["--config", "suite.yaml", "--mode", "per-model"]) == 0
    assert [status for _, _, status, _ in outcomes(capsys.readouterr().out)] == ["ok"] * len(models) * len(datasets)
    per_pair, per_model = (results_contents(folder / mode / "results") for mode in ("per-pair", "per-model"))
    assert len(per_model) == len(models) * len(datasets) and per_model.keys() == per_pair.keys()
    for key, files in per_model.items():
        assert files.keys() == per_pair[key].keys() and len(files) >= 6
        for name in files:
            assert files[name] == per_pair[key][name], (key, name)


@pytest.mark.slow  # per-model mode: a worker process per model
def test_per_model_writes_what_per_pair_writes_and_loads_the_model_once(user_models, phantom_root, monkeypatch, capsys):
    monkeypatch.chdir(user_models)  # undone after the test
    run_both_modes(user_models, phantom_root, ["Counted"], DATASETS, capsys)
    builds = ["Counted build nodule,mass,consolidation", "Counted build nodule,mass,consolidation",
              "Counted build nodule,mass"]
    # one instance whose weights load once; built for each dataset, also one with the same classes
    assert counts(user_models / "per-model") == ["Counted init", "Counted load", *builds]
    assert counts(user_models / "per-pair") == [
        line for build in builds for line in ("Counted init", "Counted load", build)]


@pytest.mark.slow  # a worker process, and GLoRIA at full size
def test_a_real_model_per_model_equals_per_pair(tmp_path, phantom_root, gloria_folder, monkeypatch, capsys):
    """GLoRIA (random weights in the authors' layout): its prompts are embedded again for the
    second dataset's classes, on the weights the first dataset's run loaded."""
    monkeypatch.chdir(tmp_path)
    monkeypatch.setenv("PYTHONPATH", str(REPO))
    # one batch of each dataset: a ResNet-50 at 299 x 299 is slow on CPUs
    model = {"config": str(CONFIGS / "models" / "gloria.yaml"),
             "settings": {"model.checkpoint_dir": str(gloria_folder), "trainer.limit_test_batches": 1}}
    run_both_modes(tmp_path, phantom_root, [model], [PHANTOM, TWO_CLASSES], capsys)
    # the limit holds in a worker too (the order of its imports once made it read 1 as 1.0: all batches)
    assert {json.loads(path.read_text())["data"]["images_evaluated"]
            for path in (tmp_path / "per-model" / "results").glob("*/metrics.json")} == {4}


@pytest.mark.slow  # a worker process killed and restarted is the point
def test_a_crash_or_a_dead_worker_loses_only_its_own_pairs(user_models, phantom_root, monkeypatch, capsys):
    monkeypatch.chdir(user_models)
    write_suite(user_models, phantom_root, ["Killed", "Flaky"], [PHANTOM, TWO_CLASSES, ROTATED])
    assert main(["--config", "suite.yaml"]) == 1
    found = outcomes(capsys.readouterr().out)
    assert [row[:3] for row in found] == [
        ("killed", "phantom", "ok"), ("killed", "phantom", "failed"), ("killed", "phantom+rotate10", "not run"),
        ("flaky", "phantom", "ok"), ("flaky", "phantom", "failed"), ("flaky", "phantom+rotate10", "ok")]
    assert found[1][3] == "its worker was killed by SIGKILL while running it"
    assert found[2][3] == "its worker was killed by SIGKILL before it"
    assert "flaky: fails on two classes" in found[4][3]
    assert len(list((user_models / "results").iterdir())) == 3  # killed on the phantom; flaky on two
    # the failed run's model is not reused: Flaky is made again for the pair after it
    assert [line for line in counts(user_models) if line.endswith(("init", "load"))] == [
        "Killed init", "Killed load", "Flaky init", "Flaky load", "Flaky init", "Flaky load"]


def test_a_pair_on_several_devices_gets_its_own_process_in_per_model_mode():
    model, other = Entry((Path("m.yaml"),)), Entry((Path("n.yaml"),))
    data = Entry((Path("d.yaml"),))

    def pair(entry, **trainer):
        return Pair(entry, data, config={"trainer": trainer} if trainer else {})

    one, two, ddp, auto, nodes, listed = (
        pair(model), pair(model), pair(model, devices=2), pair(model, devices="auto"), pair(model, num_nodes=2),
        pair(model, devices=[1]))
    last = pair(other)
    pairs = [one, two, ddp, auto, nodes, listed, last]
    assert processes(pairs, "per-model") == [
        (True, [one, two, listed]), (False, [ddp]), (False, [auto]), (False, [nodes]), (True, [last])]
    # per pair, each in a worker of its own, but those that start processes of their own
    assert processes(pairs, "per-pair") == [(worker, [p]) for worker, p in zip(
        [True, True, False, False, False, True, True], pairs)]


def test_the_mode_comes_from_the_suite_file_or_the_command_line(tmp_path, monkeypatch, capsys):
    monkeypatch.chdir(tmp_path)
    suite = {"models": [str(CONFIGS / "models" / "random.yaml")], "datasets": [PHANTOM]}
    (tmp_path / "s.yaml").write_text(yaml.safe_dump(suite))
    assert load_suite(tmp_path / "s.yaml").mode == "per-model"
    assert main(["--config", "s.yaml", "--dry-run", "--mode", "per-pair"]) == 0
    assert "1 of 1 pairs to run, per-pair" in capsys.readouterr().out
    (tmp_path / "s.yaml").write_text(yaml.safe_dump({**suite, "mode": "per-pair"}))
    assert load_suite(tmp_path / "s.yaml").mode == "per-pair"
    (tmp_path / "s.yaml").write_text(yaml.safe_dump({**suite, "mode": "together"}))
    with pytest.raises(ValueError, match="mode must be one of per-model, per-pair; got 'together'"):
        load_suite(tmp_path / "s.yaml")


def test_a_worker_refuses_a_run_on_several_processes(phantom_root, tmp_path):
    """The guard behind the routing above: a reused model cannot follow DDP's launch of processes."""
    args = run_args("random", "phantom", phantom_root, tmp_path / "results", "--trainer.accelerator", "cpu",
                    "--trainer.devices", "2", "--trainer.logger", "false")
    with pytest.raises(RuntimeError, match="asks for 2 processes, which a run inside a suite worker cannot start"):
        run_test(args, LoadedModel())
    assert not (tmp_path / "results").exists()


@pytest.mark.parametrize("precision, kept", [("32-true", True), ("bf16-mixed", True), ("16-mixed", True),
                                              ("bf16-true", False), ("16-true", False), ("64-true", False)])
def test_a_model_a_precision_converted_is_not_kept(precision, kept):
    """A fresh model builds its text side before the precision plugin converts its weights; a kept
    converted one would build it from converted weights."""
    loaded, model = LoadedModel(), object()
    loaded.keep("key", model, precision)
    assert (loaded.model is model and loaded.key == "key") if kept else (loaded.model is None and loaded.key is None)
