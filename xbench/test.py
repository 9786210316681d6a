"""Run one model on one dataset: ``python -m xbench.test --config A.yaml [--config B.yaml] [--key value]``.

The model and the dataset are chosen by ``class_path`` in the YAML files (a user's own subclass
of ``XBenchModel`` or ``XBenchDataModule`` works the same way); any key can be overridden on the
command line, e.g. ``--data.root /data/ChestX-Det10 --trainer.devices 2``. The run writes a
results folder (``--results.folder``, ``--results.overlay_pairs``: the ``ResultsWriter`` callback's
options), logs to Weights & Biases offline (``--trainer.logger false`` turns it off; see
``xbench.reporting.wandb``) and prints the summary table. ``--sanity.images N``,
``--faithfulness.images N`` and ``--robustness.images N`` add the checks of ``xbench.checks`` on N
images (off by default).
"""

from __future__ import annotations

import json
import sys
import typing
from argparse import ArgumentError
from collections.abc import Sequence
from pathlib import Path

import yaml
from lightning.pytorch import Callback, Trainer
from lightning.pytorch.cli import LightningArgumentParser, LightningCLI

from xbench.catalog import load_all
from xbench.checks.faithfulness import Faithfulness
from xbench.checks.robustness import Robustness
from xbench.checks.sanity import Sanity
from xbench.cli import run
from xbench.data.base import XBenchDataModule
from xbench.files import read_yaml
from xbench.models.base import XBenchModel
from xbench.models.explainers import NATIVE
from xbench.reporting.summary import print_summary
from xbench.reporting.wandb import abandon_runs, finish_runs
from xbench.reporting.writer import ResultsWriter

#: Trainer settings the harness depends on for correct numbers (not preferences).
TRAINER_INVARIANTS = {
    # The datamodule's ExactlyOnceSampler splits samples over processes; Lightning's
    # DistributedSampler would pad ranks with repeated samples.
    "use_distributed_sampler": False,
    "enable_checkpointing": False,
    "enable_model_summary": False,
}
#: The trainer settings every run starts from; any is overridden by a --config or on the command
#: line (e.g. --trainer.accelerator gpu --trainer.devices 8). In code, not a file beside the
#: package, so that an installed wheel starts from them too. The logger is W&B, offline unless
#: WANDB_MODE=online (or --trainer.logger.init_args.offline false); --trainer.logger false turns it off.
TRAINER_DEFAULTS = {
    "accelerator": "auto",
    "devices": 1,
    "precision": "32-true",
    "inference_mode": True,
    "enable_progress_bar": True,
    # silent: W&B's own lines (where its files go) are left to the summary's one line
    "logger": {"class_path": "xbench.reporting.wandb.XBenchWandbLogger",
               "init_args": {"project": "xbench", "silent": True}},
}


def count_before_fraction(trainer_class: type = Trainer) -> None:
    """Give the trainer's ``int or float`` options (``limit_test_batches``, ...) their declared order,
    so that ``--trainer.limit_test_batches 1`` is one batch, not 1.0 (every batch).

    Python caches ``typing`` unions by equality, and ``Union[float, int]`` equals ``Union[int,
    float]``: the Trainer's ``Optional[Union[int, float]]`` becomes whichever equal union was made
    first and is still in the cache -- Fabric's ``Optional[Union[float, int]]``, unless enough other
    annotations were made in between to evict it (importing rich before Lightning left it there).
    jsonargparse tries a union's types in order, so a float first read ``1`` as ``1.0``."""
    annotations = trainer_class.__init__.__annotations__
    for name, hint in typing.get_type_hints(trainer_class.__init__).items():
        if typing.get_origin(hint) is typing.Union and typing.get_args(hint) == (float, int, type(None)):
            annotations[name] = int | float | None


count_before_fraction()


class LoadedModel:
    """The model of this process's last run, kept for the next run with the same model and trainer
    settings (``xbench.suite_worker`` runs one model on each of its datasets in one process).

    The weights are read once, in the first run's ``build``; each later run's ``setup`` builds only
    what depends on the dataset (the model's text side for its classes). Not kept: a model whose run
    failed (it may be half built), nor one a ``*-true`` precision other than 32 converted (a fresh
    model builds its text side in float32 before the conversion).
    """

    def __init__(self) -> None:
        self.key: str | None = None
        self.model: XBenchModel | None = None

    @staticmethod
    def key_of(config) -> str:
        """The run's model and trainer sections: what the kept model must have been made with."""
        whole = config.as_dict()
        return json.dumps({name: whole.get(name) for name in ("model", "trainer", "seed_everything")},
                          sort_keys=True, default=str)

    def keep(self, key: str, model: XBenchModel, precision: str) -> None:
        if precision == "32-true" or precision.endswith("-mixed"):
            self.key, self.model = key, model
        else:
            self.forget()

    def forget(self) -> None:
        self.key, self.model = None, None


class XBenchCLI(LightningCLI):
    """LightningCLI with the checks' and the output callback's options (``--sanity.*``,
    ``--faithfulness.*``, ``--robustness.*``, ``--results.*``), which takes the model from ``loaded``
    when the run's settings are the ones it was made with, instead of instantiating another."""

    def __init__(self, *args, loaded: LoadedModel | None = None, **kwargs) -> None:
        self.loaded = loaded
        self.loaded_key: str | None = None
        super().__init__(*args, **kwargs)

    def add_arguments_to_parser(self, parser: LightningArgumentParser) -> None:
        parser.add_lightning_class_args(Sanity, "sanity")
        parser.add_lightning_class_args(Faithfulness, "faithfulness")
        parser.add_lightning_class_args(Robustness, "robustness")
        parser.add_lightning_class_args(ResultsWriter, "results")

    def before_instantiate_classes(self) -> None:
        """A CAM explainer needs gradients: the trainer's inference mode is turned off for it (the
        run's recorded config says so), instead of the run failing at its first batch."""
        explainer = ((self.config.get("model") or {}).get("init_args") or {}).get("explainer", NATIVE)
        if explainer != NATIVE and self.config.trainer.inference_mode:
            self.config.trainer.inference_mode = False

    @property
    def writer(self) -> ResultsWriter:
        return self.config_init["results"]

    def instantiate_classes(self) -> None:
        if self.loaded is None:
            return super().instantiate_classes()
        self.loaded_key = self.loaded.key_of(self.config)
        if self.loaded.model is None or self.loaded.key != self.loaded_key:
            self.loaded.forget()
            return super().instantiate_classes()
        config = self.config.clone()
        config.model = None  # jsonargparse then instantiates the data and the trainer only
        self.config_init = self.parser.instantiate_classes(config)
        self.datamodule = self._get(self.config_init, "data")
        self.model = self.loaded.model
        self.trainer = self.instantiate_trainer()


def check_config_files(args: list[str]) -> None:
    """Each ``--config`` file is a YAML mapping of settings: an empty file, another YAML value,
    invalid YAML or a path that is no regular file (a named pipe would hang the parser's ``open``)
    is a usage error naming the file (and the line), before the parser reads it."""
    values = [value for flag, value in zip(args, args[1:]) if flag == "--config"]
    values += [arg.removeprefix("--config=") for arg in args if arg.startswith("--config=")]
    for value in values:
        path = Path(value)
        if not path.exists():
            continue  # the parser names a missing file (or reads the value as YAML text)
        try:
            content = read_yaml(path)
        except ValueError as error:
            raise ArgumentError(None, f"--config {error}") from None
        if not isinstance(content, dict):
            what = "is empty" if content is None else f"holds a YAML {type(content).__name__} ({str(content)[:40]!r})"
            raise ArgumentError(None, f"--config {path} {what}, not a mapping of settings (model:, data:, trainer:, "
                                      "...): fill it in, or leave it out")


def run_test(args: list[str] | None = None, loaded: LoadedModel | None = None,
             callbacks: Sequence[Callback] = ()) -> tuple[XBenchModel, Path | None]:
    """Parse the configs, run ``trainer.test`` once, print the summary; return the model that ran
    (its ``results``) and the results folder written (``None``: none). ``loaded``: reuse and keep
    the model between runs of one process (one process only: a reused model cannot follow a
    multi-process launch). ``callbacks``: more trainer callbacks that are not part of the run's
    config (a suite worker's progress notes), so not recorded with its results."""
    check_config_files(sys.argv[1:] if args is None else list(args))
    load_all()
    cli = XBenchCLI(
        XBenchModel,
        XBenchDataModule,
        subclass_mode_model=True,
        subclass_mode_data=True,
        run=False,
        args=args,
        trainer_defaults={**TRAINER_DEFAULTS, **TRAINER_INVARIANTS},
        save_config_callback=None,
        seed_everything_default=0,
        auto_configure_optimizers=False,
        # a wrong value raises (xbench.cli turns it into one line) instead of printing jsonargparse's dump
        parser_kwargs={"description": __doc__, "exit_on_error": False},
        loaded=loaded,
    )
    if loaded is not None and cli.trainer.world_size > 1:
        raise RuntimeError(
            f"this run asks for {cli.trainer.world_size} processes, which a run inside a suite worker cannot start: "
            "give it one device, or run the suite with --mode per-pair")
    cli.model.run_config = yaml.safe_load(cli.parser.dump(cli.config, skip_none=False))
    cli.trainer.callbacks.extend(callbacks)
    try:
        cli.trainer.test(cli.model, datamodule=cli.datamodule, verbose=False)
    except BaseException:
        abandon_runs(cli.trainer.loggers)
        if loaded is not None:
            loaded.forget()
        raise
    if loaded is not None:
        loaded.keep(cli.loaded_key, cli.model, cli.trainer.precision)
    if cli.trainer.is_global_zero:
        wandb_runs = finish_runs(cli.trainer.loggers)
        if cli.model.results is not None:
            print_summary(cli.model.results, cli.writer.path, wandb_runs)
    return cli.model, cli.writer.path


def main(args: list[str] | None = None) -> dict | None:
    """Run ``xbench.test`` with ``args`` (default: the command line); return the results payload."""
    model, _ = run_test(args)
    return model.results


def cli() -> None:
    """The command line, ``xbench-test`` or ``python -m xbench.test``: a failure is a message and exit 1."""
    run(main, "xbench-test")


if __name__ == "__main__":
    cli()
