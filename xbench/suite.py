"""Run models x datasets: ``python -m xbench.suite --config lightning_configs/suites/paper.yaml``.

A suite file names model configs, dataset configs and settings (``--key value`` pairs of
``xbench.test``, as a mapping) for every run, for a model or for a dataset::

    results_dir: results
    mode: per-model          # the default; or per-pair (--mode overrides it)
    settings: {data.image_size: 224, data.batch_size: 8}
    slurm: {partition: gpu, gpus_per_task: 1, cpus_per_task: 8, mem: 64G, time: "4:00:00"}  # --launcher slurm
    models:
      - lightning_configs/models/medklip.yaml
      - {config: lightning_configs/models/kad.yaml, settings: {model.checkpoint_dir: /weights/kad}}
    datasets:
      - {config: lightning_configs/data/rsna.yaml, settings: {data.root: datasets/rsna}}
      - {config: [lightning_configs/data/rsna.yaml, lightning_configs/augment/rotate10.yaml],
         settings: {data.root: datasets/rsna}}

An entry's ``config`` may list several files, composed in order (``--config`` repeated), such as
a dataset with an augment pipeline. Its label joins their names (``rsna+rotate10``). An entry listed
twice (the same config contents and settings) is refused, naming both lines.

First the suite prints every pair and whether it will run or is skipped -- a config file, a
model's ``checkpoint_dir`` or a dataset's ``data.root`` is missing (the table names the path), or
its results already exist in ``results_dir`` (``--force`` runs it again). ``--dry-run`` stops
there. Then the pairs run, each writing the results folder its own ``python -m xbench.test`` would,
in one of two modes (``--mode``, or the suite file's ``mode``):

- ``per-model`` (the default): one ``python -m xbench.suite_worker`` process per model runs its
  datasets in turn, with the model made and its weights loaded once (its text side is built for
  each dataset's classes); the same numbers, without a start (~10 s of imports) and a load per
  pair: the paper's 7 x 7 suite starts 7 processes, not 49. A pair whose trainer asks for several
  devices or nodes still gets a process of its own (DDP starts its processes per run).
- ``per-pair``: each pair in a worker process of its own, nothing shared between pairs.

Where the processes run (``xbench.launch``): one after another here (the default), up to N at once
on this machine's GPUs or shares of its CPU cores (``--devices N``), or each as a SLURM job through
submitit (``--launcher slurm``, with the suite file's ``slurm:`` resources). Each writes the same
results folders; the jobs that run at once start longest first.

A crash stays inside its process: a pair that raises is failed and its worker goes on with the
model's next dataset (with the model made again); a worker that dies fails the pair it was running
and reports the model's later pairs as not run. The suite goes on with the other models and prints
every pair's outcome. The exit status is 1 if any pair failed or did not run, if a config file the
suite names does not exist, or if no pair could run.

One suite at a time runs in a results folder: a second one exits, naming the first (its lock is
``<results_dir>/.suite/lock``); start it again once the first ends, and it skips what that one
finished. A job ends when the suite does, ``kill -9`` included (here on Linux at once; a SLURM job
once it has not seen the suite for 5 minutes).
"""

from __future__ import annotations

import argparse
import importlib
import inspect
import json
import warnings
from dataclasses import dataclass, field
from itertools import groupby
from pathlib import Path
from typing import Any

import yaml
from rich.console import Console

from xbench import costs
from xbench.cli import run
from xbench.console import print_table
from xbench.files import open_text, read_yaml
from xbench.launch import (LAUNCHERS, Job, SlurmResources, describe, launch, parse_slurm, result_folders,
                           results_lock)
from xbench.models.hub import checkpoint_folder
from xbench.results.folder import MODEL_OUTPUT_OPTIONS, SCHEMA, read_results
from xbench.results.write import check_writable

SUITE_KEYS = {"results_dir", "mode", "settings", "models", "datasets", "slurm"}
#: How pairs map to processes; the first is the default.
MODES = ("per-model", "per-pair")


@dataclass(frozen=True)
class Entry:
    """A model or dataset of the suite: its config files (composed in order) and its own settings."""

    configs: tuple[Path, ...]
    settings: dict[str, Any] = field(default_factory=dict)

    @property
    def label(self) -> str:
        """The configs' names joined (``rsna+rotate10``), and a model's CAM explainer, as its results
        name it (``clip+gradcam``): a run with other maps, and another cost, than the native one."""
        explainer = self.settings.get("model.explainer", "native")
        return "+".join([*(config.stem for config in self.configs), *([explainer] if explainer != "native" else [])])


@dataclass(frozen=True)
class Suite:
    results_dir: Path
    settings: dict[str, Any]
    models: list[Entry]
    datasets: list[Entry]
    mode: str
    slurm: SlurmResources | None = None  # what each job asks SLURM for (--launcher slurm)


@dataclass
class Pair:
    """One model on one dataset. ``status``: ``run``, ``done`` (results exist) or ``missing``."""

    model: Entry
    dataset: Entry
    status: str = "run"
    detail: str = ""
    config: dict = field(default_factory=dict)

    @property
    def name(self) -> str:
        return f"{self.model.label} on {self.dataset.label}"


def _configs(value: Any) -> tuple[Path, ...] | None:
    if isinstance(value, str):
        return (Path(value),)
    if isinstance(value, list) and value and all(isinstance(v, str) for v in value):
        return tuple(map(Path, value))
    return None


def _settings_mapping(value: Any, where: str) -> dict[str, Any]:
    """A ``settings`` block: a mapping of ``xbench.test`` option names (without ``--``) to values."""
    if value is None:
        return {}
    if not isinstance(value, dict) or not all(isinstance(key, str) for key in value):
        raise ValueError(f"{where}: settings must be a mapping of xbench.test options to values, e.g. "
                         f"{{data.image_size: 224, data.batch_size: 8}}; got {value!r}")
    return dict(value)


def _entry(item: Any, where: str) -> Entry:
    if isinstance(item, dict) and set(item) <= {"config", "settings"}:
        configs, settings = _configs(item.get("config")), _settings_mapping(item.get("settings"), where)
    else:
        configs, settings = (_configs(item) if isinstance(item, str) else None), {}
    if configs is None:
        raise ValueError(
            f"{where}: expected a config path or {{config: PATH or [PATH, ...], settings: {{...}}}}; got {item!r}")
    return Entry(configs, settings)


def load_suite(path: Path) -> Suite:
    raw = read_yaml(path)
    if not isinstance(raw, dict):
        raise ValueError(f"{path}: a suite file is a mapping with the keys {sorted(SUITE_KEYS)}; got "
                         f"{'an empty file' if raw is None else f'a YAML {type(raw).__name__}'}")
    unknown = set(raw) - SUITE_KEYS
    if unknown:
        raise ValueError(f"{path}: unknown keys {sorted(unknown)}; a suite has {sorted(SUITE_KEYS)}")
    for key in ("models", "datasets"):
        if not raw.get(key) or not isinstance(raw[key], list):
            raise ValueError(f"{path}: `{key}` must list at least one config; got {raw.get(key)!r}")
    mode = raw.get("mode", MODES[0])
    if mode not in MODES:
        raise ValueError(f"{path}: mode must be one of {', '.join(MODES)}; got {mode!r}")
    results_dir = raw.get("results_dir", "results")
    if not isinstance(results_dir, str) or not results_dir or not results_dir.isprintable():
        raise ValueError(f"{path}: results_dir must be a folder's path, without line breaks or other control "
                         f"characters (each SLURM job's script names its log in it); got {results_dir!r}")
    entries = {key: [_entry(item, f"{path}: {key}[{i}]") for i, item in enumerate(raw[key])]
               for key in ("models", "datasets")}
    for key, listed in entries.items():
        _refuse_repeats(path, key, listed)
    return Suite(
        mode=mode,
        results_dir=Path(results_dir),
        settings=_settings_mapping(raw.get("settings"), f"{path}: settings"),
        models=entries["models"],
        datasets=entries["datasets"],
        slurm=None if raw.get("slurm") is None else parse_slurm(raw["slurm"], str(path)),
    )


def _identity(entry: Entry) -> str:
    """What makes an entry's runs: its config files' contents (so ``a.yaml``, ``./a.yaml``, a link
    to it or a copy under another name are one model) and its settings."""
    contents = [read_yaml(config) if config.exists() else str(config.resolve()) for config in entry.configs]
    return json.dumps([contents, entry.settings], sort_keys=True, default=str)


def _refuse_repeats(path: Path, key: str, entries: list[Entry]) -> None:
    """An entry listed twice would run each of its pairs twice, writing two results folders of one
    run without a word: refused, naming both lines of the suite file."""
    first: dict[str, int] = {}
    for index, entry in enumerate(entries):
        seen = first.setdefault(_identity(entry), index)
        if seen != index:
            lines = _item_lines(path, key)
            raise ValueError(
                f"{path}, lines {lines[seen]} and {lines[index]}: {key}[{seen}] ({entries[seen].label}) and "
                f"{key}[{index}] ({entry.label}) are the same {key[:-1]}, the same config and settings, so each of "
                "its pairs would run twice: keep one (or give one other settings)")


def _item_lines(path: Path, key: str) -> list[int]:
    """The line (from 1) where each item of the suite file's ``key`` list starts, for a message."""
    with open_text(path) as handle:
        root = yaml.compose(handle, Loader=yaml.SafeLoader)
    items = next(value for name, value in root.value if name.value == key)
    return [item.start_mark.line + 1 for item in items.value]


# -- what a pair's run will see ----------------------------------------------------------------


def _merge(into: dict, update: dict) -> dict:
    for key, value in update.items():
        if isinstance(value, dict) and isinstance(into.get(key), dict):
            _merge(into[key], value)
        else:
            into[key] = value
    return into


def _nested(key: str, value: Any) -> dict:
    """A ``--key value`` setting as config nesting: ``data.root`` -> ``{data: {init_args: {root}}}``."""
    parts = key.split(".")
    if parts[0] in ("model", "data") and len(parts) > 1 and parts[1] not in ("init_args", "class_path"):
        parts.insert(1, "init_args")
    nested: Any = value
    for part in reversed(parts):
        nested = {part: nested}
    return nested


def _settings(suite: Suite, pair: Pair) -> dict[str, Any]:
    return {**suite.settings, **pair.model.settings, **pair.dataset.settings}


def composed_config(suite: Suite, pair: Pair) -> dict:
    """The pair's config as the run will compose it: model file, data file, then the settings."""
    config: dict = {}
    for entry in (pair.model, pair.dataset):
        for path in entry.configs:
            content = read_yaml(path)
            if not isinstance(content, dict):
                raise ValueError(f"{path} (in the suite as {entry.label}) is {'empty' if content is None else 'not a mapping'}"
                                 "; a config file is a mapping of settings (model:, data:, trainer:, ...)")
            _merge(config, content)
    for key, value in _settings(suite, pair).items():
        _merge(config, _nested(key, value))
    return config


def run_arguments(suite: Suite, pair: Pair) -> list[str]:
    args = [arg for entry in (pair.model, pair.dataset) for path in entry.configs for arg in ("--config", str(path))]
    for key, value in _settings(suite, pair).items():
        args += [f"--{key}", value if isinstance(value, str) else json.dumps(value)]
    return args + ["--results.folder", str(suite.results_dir)]


def _class(section: dict, where: str):
    class_path = section.get("class_path")
    if not class_path:
        raise LookupError(f"{where} has no class_path")
    module, _, name = class_path.rpartition(".")
    try:
        return getattr(importlib.import_module(module), name)
    except (ImportError, AttributeError) as error:
        raise LookupError(f"cannot import {class_path} ({error})") from None


def _argument(cls, section: dict, name: str) -> tuple[bool, Any]:
    """Whether ``cls`` takes ``name``, and its value: the config's, else the default (``...``: none)."""
    parameter = inspect.signature(cls).parameters.get(name)
    if parameter is None:
        return False, None
    init_args = section.get("init_args") or {}
    if name in init_args:
        return True, init_args[name]
    return True, ... if parameter.default is inspect.Parameter.empty else parameter.default


def _defaults(cls) -> dict[str, Any]:
    """Every keyword default of ``cls`` and its bases (a subclass's default wins): what a run
    resolves for an argument its config leaves out."""
    defaults: dict[str, Any] = {}
    for klass in reversed(cls.__mro__):
        init = klass.__dict__.get("__init__")
        if init is None:
            continue
        for name, parameter in inspect.signature(init).parameters.items():
            if parameter.default is not inspect.Parameter.empty:
                defaults[name] = parameter.default
    return defaults


def _resolved(cls, section: dict) -> dict[str, Any]:
    """The section's class and init arguments with its defaults filled in, as JSON would hold them
    (a saved config is fully resolved), minus where results go."""
    init_args = {**_defaults(cls), **(section.get("init_args") or {})}
    for option in MODEL_OUTPUT_OPTIONS:
        init_args.pop(option, None)
    return json.loads(json.dumps({"class_path": section.get("class_path"), "init_args": init_args}, default=str))


def same_run(config: dict, saved: dict, model, data) -> bool:
    """Whether a saved run's model and data sections are the pair's, every argument compared
    after defaults are filled in on both sides (an earlier run with a changed setting the pair
    leaves at its default, e.g. an augment pipeline, is not the pair's run)."""
    return all(
        _resolved(cls, config.get(name) or {}) == _resolved(cls, saved.get(name) or {})
        for name, cls in (("model", model), ("data", data))
    )


def existing_results(results_dir: Path) -> list[tuple[Path, dict]]:
    """Every results folder under ``results_dir`` with its resolved config; a folder another XBench
    version wrote (another results schema) or a damaged one (`read_results` refuses it) is not this
    version's result: its pair runs again."""
    found, older = [], []
    for folder in result_folders(results_dir):
        try:
            payload = read_results(folder)
        except ValueError as error:  # another version's, or damaged: not this version's result (the warning says why)
            older.append(error)
            continue
        found.append((folder, payload["config"]))
    if older:
        warnings.warn(
            f"{len(older)} results folder(s) under {results_dir} were written by another XBench version (not schema "
            f"{SCHEMA}) or are damaged, e.g. {older[0]}: their pairs count as not done and run again",
            stacklevel=2,
        )
    return found


def check(suite: Suite, pair: Pair, existing: list[tuple[Path, dict]], force: bool) -> None:
    """Set the pair's status: a missing file or folder, results that exist, or ready to run."""
    for path in (*pair.model.configs, *pair.dataset.configs):
        if not path.exists():  # a named pipe or a folder is refused naming it when read, below
            pair.status, pair.detail = "missing", f"config {path}"
            return
    pair.config = composed_config(suite, pair)
    try:
        model = _class(pair.config.get("model", {}), f"{pair.model.label}: model")
        data = _class(pair.config.get("data", {}), f"{pair.dataset.label}: data")
    except LookupError as error:
        pair.status, pair.detail = "missing", str(error)
        return
    takes, checkpoint_dir = _argument(model, pair.config["model"], "checkpoint_dir")
    if takes and checkpoint_dir not in (None, ...):
        try:
            folder = checkpoint_folder(checkpoint_dir, "model.checkpoint_dir")
        except FileNotFoundError as error:  # a hub id the local cache lacks, with its download command
            pair.status, pair.detail = "missing", str(error)
            return
        if not folder.is_dir() or not any(folder.iterdir()):
            pair.status, pair.detail = "missing", f"checkpoint_dir {folder} (see checkpoints/README.md)"
            return
    takes, root = _argument(data, pair.config["data"], "root")
    if takes and root is ...:
        pair.status = "missing"
        pair.detail = "data.root is not set (give the dataset settings: {data.root: ...} in the suite)"
        return
    if takes and root is not None and not Path(root).expanduser().exists():
        pair.status, pair.detail = "missing", f"data.root {root}"
        return
    done = [folder for folder, config in existing if same_run(pair.config, config, model, data)]
    if done and not force:
        pair.status, pair.detail = "done", str(done[-1])


def plan(suite: Suite, force: bool = False) -> list[Pair]:
    existing = existing_results(suite.results_dir)
    pairs = [Pair(model, dataset) for model in suite.models for dataset in suite.datasets]
    for pair in pairs:
        check(suite, pair, existing, force)
    return pairs


# -- running -----------------------------------------------------------------------------------


def one_process(config: dict) -> bool:
    """Whether the pair's trainer runs in one process (one device of one node), so that it can share
    a worker: ``devices: auto``, ``-1`` or several, or several nodes, get a process of their own."""
    trainer = config.get("trainer") or {}
    devices = trainer.get("devices", 1)
    one_device = devices in (1, "1") or (isinstance(devices, list) and len(devices) == 1)
    return one_device and trainer.get("num_nodes", 1) in (1, "1")


def processes(pairs: list[Pair], mode: str) -> list[tuple[bool, list[Pair]]]:
    """The pairs as processes run them, each as (a worker?, its pairs): per-pair, a worker for each
    one-process pair; per-model, one worker per model for its one-process pairs; the others each in
    a process of their own (``python -m xbench.test``: DDP starts its processes per run)."""
    if mode == "per-pair":
        return [(one_process(pair.config), [pair]) for pair in pairs]
    batches: list[tuple[bool, list[Pair]]] = []
    for _, group in groupby(pairs, key=lambda pair: id(pair.model)):  # plan() lists pairs model by model
        group = list(group)
        shared = [pair for pair in group if one_process(pair.config)]
        batches += [(True, shared)] if shared else []
        batches += [(False, [pair]) for pair in group if not one_process(pair.config)]
    return batches


STATUS_TEXT = {"run": "[green]run", "done": "[dim]skip: results exist", "missing": "[yellow]skip: missing"}
OUTCOME_TEXT = {"ok": "[green]ok", "failed": "[red]failed", "not run": "[red]not run"}


def print_pairs(console: Console, title: str, rows: list[tuple[str, str, str, str]]) -> None:
    print_table(console, title, ("#", "Model", "Dataset", "Status", "Path / detail"),
                [(str(i), *row) for i, row in enumerate(rows, start=1)], labels=5, fold=(4,))


def jobs(suite: Suite, to_run: list[Pair], mode: str) -> list[Job]:
    """The pairs to run as jobs, in the suite's order, each with its cost where recorded."""
    found, first = [], 1
    for worker, batch in processes(to_run, mode):
        one_model = len({id(pair.model) for pair in batch}) == 1 and mode == "per-model" and worker
        found.append(Job(
            number=len(found) + 1,
            label=batch[0].model.label if one_model else batch[0].name,
            pairs=batch,
            tasks=[{"number": first + i, "total": len(to_run), "name": pair.name, "args": run_arguments(suite, pair)}
                   for i, pair in enumerate(batch)],
            labels=[pair.dataset.label if one_model else pair.name for pair in batch],
            worker=worker,
            estimate=costs.seconds((pair.model.label, pair.dataset.configs[0].stem) for pair in batch),
        ))
        first += len(batch)
    return found


def main(args: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m xbench.suite", description=__doc__,
                                     formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--config", required=True, type=Path, help="the suite file")
    parser.add_argument("--dry-run", action="store_true", help="print which pairs would run and which are skipped")
    parser.add_argument("--force", action="store_true", help="run pairs whose results already exist again")
    parser.add_argument("--mode", choices=MODES, help="one process per model (default; or the suite file's `mode`) "
                        "or one per pair")
    parser.add_argument("--launcher", choices=LAUNCHERS, default=LAUNCHERS[0],
                        help="run the jobs on this machine (default) or as SLURM jobs (the suite file's slurm: block)")
    parser.add_argument("--devices", type=int, default=1, metavar="N",
                        help="with --launcher local: run up to N jobs at once, each on a GPU of its own or, without "
                        "one, on a share of the CPU cores")
    options = parser.parse_args(args)
    if options.devices < 1:
        parser.error(f"--devices is how many jobs run at once, at least 1; got {options.devices}")
    if options.launcher == "slurm" and options.devices != 1:
        parser.error("--devices is for --launcher local; under SLURM each job gets the suite file's slurm: resources")
    suite = load_suite(options.config)
    if options.dry_run:
        return run_suite(suite, options)
    check_writable(suite.results_dir, f"results_dir (in {options.config})")
    with results_lock(suite.results_dir, options.config):  # planned and run by no other suite meanwhile
        return run_suite(suite, options)


def run_suite(suite: Suite, options: argparse.Namespace) -> int:
    """Plan the suite and, unless ``--dry-run``, run it; the exit status."""
    mode = options.mode or suite.mode
    console = Console()
    if not console.is_terminal:  # a log file or a pipe: keep each pair on one line
        console = Console(width=200)
    pairs = plan(suite, force=options.force)
    to_run = [p for p in pairs if p.status == "run"]
    where = "SLURM" if options.launcher == "slurm" else f"{options.devices} at once" if options.devices > 1 else "here"
    print_pairs(console, f"Suite {options.config}: {len(to_run)} of {len(pairs)} pairs to run, {mode}, {where}",
                [(p.model.label, p.dataset.label, STATUS_TEXT[p.status], p.detail) for p in pairs])
    if options.launcher == "slurm" and suite.slurm is not None:
        console.print(f"Each SLURM job: {describe(suite.slurm)}", highlight=False)
    if options.dry_run:
        return 0
    absent = sorted({str(path) for pair in pairs for path in (*pair.model.configs, *pair.dataset.configs)
                     if not path.is_file()})
    outcomes = launch(console, jobs(suite, to_run, mode), suite.results_dir, options.launcher, options.devices,
                      suite.slurm) if to_run else []
    done = {id(pair): (OUTCOME_TEXT[status], detail) for pair, status, detail in outcomes}
    rows = [(p.model.label, p.dataset.label, *done.get(id(p), (STATUS_TEXT[p.status], p.detail))) for p in pairs]
    print_pairs(console, "Suite results", rows)
    if absent:
        console.print(f"[red]{options.config} names config files that do not exist: {', '.join(absent)}; their pairs did "
                      "not run. Correct the paths in the suite file.")
    elif not outcomes and not all(pair.status == "done" for pair in pairs):
        console.print("[red]No pair could run: each is missing a file or folder (the table names it).")
    return 1 if absent or any(status != "ok" for _, status, _ in outcomes) or not (
        outcomes or all(pair.status == "done" for pair in pairs)) else 0


def cli() -> None:
    """The command line, ``xbench-suite`` or ``python -m xbench.suite``: exit 1 if a pair failed."""
    run(main, "xbench-suite")


if __name__ == "__main__":
    cli()
