"""The whole path, files -> DataModule -> model -> metrics -> results folder, through the CLI."""

import json
import subprocess
import sys
from argparse import ArgumentError
import typing
from pathlib import Path

import lightning as L
import pandas as pd
import pytest
import torch
import yaml
from lightning.pytorch.callbacks import Callback

from conftest import SUBPROCESS_SAFETY_TIMEOUT, only_folder, run_args
from xbench.data.phantom import Phantom
from xbench.models.baselines import RandomSaliency
from xbench.test import count_before_fraction, main



def cli_args(model: str, data_root: Path, results: Path, *extra: str) -> list[str]:
    return run_args(model, "phantom", data_root, results, "--data.batch_size", "4", *extra)


def numbers(payload: dict) -> dict:
    return {key: payload[key] for key in ("grounding", "classification", "data")}


def test_oracle_is_perfect_and_results_folder_is_complete(phantom_root, tmp_path):
    results = main(cli_args("oracle", phantom_root, tmp_path / "results"))
    folder = only_folder(tmp_path / "results")
    assert folder.name.startswith("oracle__phantom__")
    for name in ("metrics.json", "per_class.csv", "summary.md", "pairs.csv.gz", "config.yaml"):
        assert (folder / name).is_file(), name
    payload = json.loads((folder / "metrics.json").read_text())
    assert payload == json.loads(json.dumps(results))
    assert payload["schema"] == "xbench.results/4"
    graded_classes = [k for k, v in payload["grounding"]["per_class"].items() if v["pairs"] > 0]
    assert graded_classes, "the phantom must have lesions"
    for key in graded_classes:
        v = payload["grounding"]["per_class"][key]
        assert v["pointing_game"] == 1.0 and v["dice@best"] == 1.0 and v["iou@best"] == 1.0, key
    for key, v in payload["classification"]["per_class"].items():
        if v["positives"] and v["negatives"]:
            assert v["auroc"] == 1.0
    assert payload["data"]["images_evaluated"] == payload["data"]["images_in_split"] == 9
    assert payload["config"]["model"]["class_path"] == "xbench.models.baselines.Oracle"

    pairs = pd.read_csv(folder / "pairs.csv.gz")
    assert len(pairs) == 9 * len(payload["classes"])
    graded = pairs[pairs["graded"]]
    assert len(graded) == sum(v["pairs"] for v in payload["grounding"]["per_class"].values())
    # the oracle's map is the mask: at every tau > 0 the predicted pixels are exactly the region
    assert (graded["pred_050"] == graded["region_px"]).all() and (graded["inter_050"] == graded["region_px"]).all()
    per_class = pd.read_csv(folder / "per_class.csv")
    assert list(per_class["class"]) == payload["classes"]
    assert "best" in (folder / "summary.md").read_text()


def test_single_class_dataset(phantom_root, tmp_path):
    results = main(cli_args("oracle", phantom_root, tmp_path, "--data.classes", "[mass]"))
    assert results["classes"] == ["mass"]
    assert results["grounding"]["per_class"]["mass"]["pointing_game"] == 1.0
    assert results["data"]["lost_regions"] == {"mass": 0}


@pytest.mark.parametrize("model", ["centre_prior", "random"])
def test_baselines_score_below_the_oracle_and_repeat_exactly(model, phantom_root, tmp_path):
    first = main(cli_args(model, phantom_root, tmp_path / "a"))
    second = main(cli_args(model, phantom_root, tmp_path / "b"))
    assert numbers(first) == numbers(second)
    macro = first["grounding"]["macro"]
    assert macro["pointing_game"] < 1.0 and macro["dice@best"] < 1.0 and macro["iou@best"] < 1.0


def test_unknown_config_key_is_a_clear_error(phantom_root, tmp_path):
    """From a script, main raises; the command line turns it into one line (tests/test_bad_inputs.py)."""
    with pytest.raises(ArgumentError, match="imagesize"):
        main(cli_args("oracle", phantom_root, tmp_path, "--data.imagesize", "64"))


class Bf16Random(RandomSaliency):
    """Random maps and logits rounded to bf16, returned as bf16 (as a network under autocast returns
    them) or as their exact float32 values."""

    def __init__(self, as_bf16: bool, **kwargs) -> None:
        super().__init__(**kwargs)
        self.as_bf16 = as_bf16

    def infer(self, batch: dict):
        logits, maps = (values.bfloat16() for values in super().infer(batch))
        return (logits, maps) if self.as_bf16 else (logits.float(), maps.float())


class SaliencyDtypes(Callback):
    def __init__(self) -> None:
        self.seen = set()

    def on_test_batch_end(self, trainer, pl_module, outputs, batch, batch_idx, dataloader_idx=0):
        self.seen.add(outputs["saliency"].dtype)


def test_bf16_mixed_harness_works_on_the_float32_values_of_bf16_outputs(phantom_root):
    """Under bf16-mixed, a model's bf16 maps and logits reach upsampling, normalisation and the metrics
    as float32: every number equals a float32 run on the same values."""
    results = {}
    for precision, as_bf16 in (("bf16-mixed", True), ("32-true", False)):
        model, dtypes = Bf16Random(as_bf16=as_bf16), SaliencyDtypes()
        trainer = L.Trainer(accelerator="cpu", devices=1, precision=precision, use_distributed_sampler=False,
                            logger=False, callbacks=[dtypes], enable_progress_bar=False, enable_model_summary=False)
        trainer.test(model, datamodule=Phantom(root=str(phantom_root), image_size=64, batch_size=4, num_workers=0),
                     verbose=False)
        assert dtypes.seen == {torch.float32}
        results[precision] = numbers(model.results)
    assert results["bf16-mixed"] == results["32-true"]


@pytest.mark.slow  # what a fresh interpreter imported first is the point
def test_limit_test_batches_1_is_one_batch_also_when_rich_was_imported_first(tmp_path):
    """``--trainer.limit_test_batches 1`` is one batch, not 1.0 (every batch), whatever a process
    imported before Lightning. With rich first, typing's cache of equal unions handed the Trainer
    Fabric's ``Optional[Union[float, int]]``, and jsonargparse tried float first."""
    script = ("import rich.console, rich.progress, rich.table\n"
              "from xbench.test import main\n"
              "main(['--model', 'Oracle', '--data', 'Phantom', '--trainer.limit_test_batches', '1',"
              " '--trainer.limit_val_batches', '0.5', '--print_config'])\n")
    done = subprocess.run([sys.executable, "-c", script], cwd=tmp_path, capture_output=True, text=True,
                          timeout=SUBPROCESS_SAFETY_TIMEOUT)
    assert done.returncode == 0, done.stderr[-3000:]
    trainer = yaml.safe_load(done.stdout)["trainer"]
    assert trainer["limit_test_batches"] == 1 and isinstance(trainer["limit_test_batches"], int)
    assert trainer["limit_val_batches"] == 0.5


def test_count_before_fraction_restores_the_declared_order():
    class Trainer:
        def __init__(self, limit: typing.Union[float, int, None] = None, name: str = "", ratio: float = 1.0) -> None:
            pass

    count_before_fraction(Trainer)
    hints = typing.get_type_hints(Trainer.__init__)
    assert typing.get_args(hints["limit"]) == (int, float, type(None))
    assert hints["name"] is str and hints["ratio"] is float
