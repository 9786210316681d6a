"""Run one model on one dataset: ``python -m xbench.test --config A.yaml [--config B.yaml] [--key value]``.

The model and the dataset are chosen by ``class_path`` in the YAML files (a user's own subclass
of ``XBenchModel`` or ``XBenchDataModule`` works the same way); any key can be overridden on the
command line, e.g. ``--data.root /data/ChestX-Det10 --trainer.devices 2``. The run writes a
results folder, logs to Weights & Biases offline (``--trainer.logger false`` turns it off; see
``xbench.reporting.wandb``) and prints the summary table.
"""

from __future__ import annotations

from pathlib import Path

import yaml
from lightning.pytorch.cli import LightningCLI
from rich.console import Console
from rich.table import Table

from xbench.cli import run
from xbench.catalog import load_all
from xbench.data.base import XBenchDataModule
from xbench.models.base import XBenchModel
from xbench.reporting.results import summary_footnotes, summary_tables
from xbench.reporting.wandb import abandon_runs, finish_runs

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
    "logger": {"class_path": "xbench.reporting.wandb.XBenchWandbLogger", "init_args": {"project": "xbench"}},
}


def print_summary(results: dict, path: Path | None, offline_runs: list[str]) -> None:
    console = Console()
    console.rule(f"[bold]{results['model']} on {results['dataset']}")
    for title, headers, rows in summary_tables(results):
        table = Table(title=title, title_style="bold")
        table.add_column(headers[0], no_wrap=True)
        for header in headers[1:]:
            table.add_column(header, justify="right")
        for i, row in enumerate(rows):
            table.add_row(*row, end_section=i == len(rows) - 2, style="bold" if i == len(rows) - 1 else None)
        console.print(table)
    for note in summary_footnotes(results):
        console.print(note, style="dim")
    if path is not None:
        console.print(f"Results written to [bold]{path}[/bold]")
    for run in offline_runs:
        console.print(f"W&B run saved offline in {run} (upload it with `wandb sync {run}`)")


def main(args: list[str] | None = None) -> dict | None:
    """Parse the configs, run ``trainer.test`` once, print the summary; return the results payload."""
    load_all()
    cli = LightningCLI(
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
    )
    cli.model.run_config = yaml.safe_load(cli.parser.dump(cli.config, skip_none=False))
    try:
        cli.trainer.test(cli.model, datamodule=cli.datamodule, verbose=False)
    except BaseException:
        abandon_runs(cli.trainer.loggers)
        raise
    if cli.trainer.is_global_zero:
        offline_runs = finish_runs(cli.trainer.loggers)
        if cli.model.results is not None:
            print_summary(cli.model.results, cli.model.results_path, offline_runs)
    return cli.model.results


def cli() -> None:
    """The command line, ``xbench-test`` or ``python -m xbench.test``: a failure is a message and exit 1."""
    run(main, "xbench-test")


if __name__ == "__main__":
    cli()
