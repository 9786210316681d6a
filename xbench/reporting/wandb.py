"""Weights & Biases logging of a run, offline unless asked otherwise.

``python -m xbench.test`` logs every run through `XBenchWandbLogger` (the default in
``TRAINER_DEFAULTS`` in ``xbench/test.py``). It writes an offline run under ``./wandb/`` (or
``$WANDB_DIR``) that ``wandb sync wandb/offline-run-*`` uploads later; ``WANDB_MODE=online`` or
``--trainer.logger.init_args.offline false`` logs online; ``--trainer.logger false`` turns it off.

At the end of a run `log_run` names the run ``<model>__<dataset>`` (the model's name joined by
a CAM explainer's, ``clip+gradcam++``, so each explainer's maps are a run of their own) and adds, to
any Lightning ``WandbLogger``: the resolved config and the explainer,
the flat summary metrics (``grounding/pointing_game/macro``, ...), a per-class table, for a paper
model on a paper dataset the paper's cells beside the run's (``reproduction``), the Dice- and
IoU-vs-tau curves per class and a table of saliency overlays of the saved pairs. A gaze dataset's run
adds the gaze metrics to the summary (``gaze/nss/macro``, ``gaze/shuffled_auc/<class>``, ...), a
per-class table of them (``gaze/per_class``) and, in the overlays table, each pair's gaze density.

Each model's gap to the human readers is known only once both runs are analysed: `human_gap_keys`
names those numbers for the model's W&B run (``python -m xbench.analyze`` writes them into
``analysis.json``'s ``wandb``).
"""

from __future__ import annotations

import math
import os
from pathlib import Path

import numpy as np
from lightning.pytorch.loggers import Logger, WandbLogger

from xbench.metrics.names import metric, run_keys
from xbench.results.names import finding_display
from xbench.results.payload import CLASSIFICATION_PER_CLASS, GROUNDING_PER_CLASS, log_keys

#: Added to the W&B column name of a per-class value chosen on the evaluated set itself.
CHOSEN_SUFFIX = " (chosen on evaluated set)"


class XBenchWandbLogger(WandbLogger):
    """Lightning's ``WandbLogger`` with XBench's defaults.

    Args:
        project: the W&B project.
        offline: ``None`` (default): offline, unless ``WANDB_MODE`` is set (``online``, ``disabled``,
            ...), which W&B then follows.
        save_dir: where ``wandb/`` goes; ``None``: ``$WANDB_DIR`` or the working directory.
        silent: W&B prints none of its own lines (where its files go, ``wandb leet``): ``xbench.test``
            sets it, and its summary says where the run went.
        kwargs: anything else ``WandbLogger`` / ``wandb.init`` take (``entity``, ``tags``, ...).
    """

    def __init__(self, project: str = "xbench", offline: bool | None = None, save_dir: str | None = None,
                 silent: bool = False, **kwargs) -> None:
        if offline is None:
            offline = "WANDB_MODE" not in os.environ
        # The summary table already shows every number; W&B need not print them again at the end. An
        # environment setting, since Lightning re-attaches copies of the logger to the run.
        os.environ.setdefault("WANDB_QUIET", "true")
        if silent:  # a run's own setting: WANDB_SILENT is read once per process, by the first run
            kwargs["settings"] = {**(kwargs.get("settings") or {}), "silent": True}
        super().__init__(project=project, offline=offline, save_dir=save_dir, **kwargs)
        # Lightning passes ``anonymous=None`` when unset, which W&B reads as set and warns about
        # through its own printer (no ``warnings`` filter reaches it).
        if self._wandb_init.get("anonymous") is None:
            self._wandb_init.pop("anonymous", None)


def wandb_loggers(loggers: list[Logger]) -> list[WandbLogger]:
    return [logger for logger in loggers if isinstance(logger, WandbLogger)]


def per_class_rows(results: dict) -> tuple[list[str], list[list]]:
    """Columns and rows of the per-class table: one row per class, every per-class number."""
    columns = ["class", "finding"]
    columns += [f"grounding/{n}" + (CHOSEN_SUFFIX if metric(n).chosen else "") for n in GROUNDING_PER_CLASS]
    columns += [f"classification/{n}" + (CHOSEN_SUFFIX if metric(n).chosen else "") for n in CLASSIFICATION_PER_CLASS]
    rows = []
    for key in results["classes"]:
        g, c = results["grounding"]["per_class"][key], results["classification"]["per_class"][key]
        rows.append([key, finding_display(results, key), *(g[n] for n in GROUNDING_PER_CLASS),
                     *(c[n] for n in CLASSIFICATION_PER_CLASS)])
    return columns, rows


#: The W&B sections of each human-gap table of the analysis, with the column each holds.
HUMAN_GAP_SECTIONS = {"human_gaps": (("human_gap", "difference"), ("human_decrease", "decrease")),
                      "gaze_gaps": (("human_gap", "difference"), ("human_share", "share"))}


def human_gap_keys(tables: dict) -> dict[str, dict[str, float]]:
    """The W&B summary keys of each model's gap to the human readers (the analysis' ``human_gaps``
    and ``gaze_gaps`` tables, `HUMAN_GAP_SECTIONS`), by the model's W&B run name ``<model>__<dataset>``
    (`log_run`'s), in `log_keys`' shape ``<section>/<metric>/<class>`` (a finding key or ``macro``),
    the reader set after the section: ``human_gap/<reader set>/<metric>/<class>`` (model − human, a
    grounding or a gaze metric), ``human_decrease/<reader set>/<metric>/<class>`` ((human − model) /
    human, grounding) and ``human_share/<reader set>/<metric>/<class>`` (model / human, gaze), each
    with ``.../lower`` and ``.../upper``; an undefined value (NaN: a finding without pairs, a human
    value of 0) is left out."""
    keys: dict[str, dict[str, float]] = {}
    for table, sections in HUMAN_GAP_SECTIONS.items():
        for row in tables[table].to_dict("records"):
            run = keys.setdefault(f"{row['model']}__{row['dataset']}", {})
            for section, column in sections:
                name = f"{section}/{row['human']}/{row['metric']}/{row['class']}"
                for key, value in ((name, row[column]), (f"{name}/lower", row[f"{column}_lower"]),
                                   (f"{name}/upper", row[f"{column}_upper"])):
                    if not math.isnan(value):
                        run[key] = float(value)
    return keys


def gaze_rows(results: dict) -> tuple[list[str], list[list]]:
    """Columns and rows of the gaze table: one row per class, its pairs and every gaze metric."""
    names = run_keys("gaze", "per_class")
    columns = ["class", "finding", "pairs", *(f"gaze/{n}" for n in names)]
    section = results["gaze"]["per_class"]
    return columns, [[key, finding_display(results, key), section[key]["pairs"], *(section[key][n] for n in names)]
                     for key in results["classes"]]


def log_run(loggers: list[Logger], results: dict, overlays: dict[str, np.ndarray], folder: Path | None) -> None:
    """Log a finished run to every ``WandbLogger`` among ``loggers`` (call on rank 0 only)."""
    targets = wandb_loggers(loggers)
    if not targets:
        return
    import wandb

    from xbench.reporting.figures import overlay_rgb
    from xbench.reporting.reproduction import RUN_COLUMNS, paper_rows

    columns, rows = per_class_rows(results)
    reproduction = paper_rows(results)
    thresholds = results["thresholds"]
    graded = [key for key in results["classes"] if results["grounding"]["per_class"][key]["pairs"] > 0]
    for logger in targets:
        run = logger.experiment
        run.name = f"{results['model']}__{results['dataset']}"
        run.config.update({"xbench": results["config"], "explainer": results["explainer"],
                           "results_folder": None if folder is None else str(folder),
                           "chosen_on_evaluated_set": results["chosen_on_evaluated_set"]}, allow_val_change=True)
        run.summary.update(log_keys(results))
        media = {"per_class": wandb.Table(columns=columns, data=rows)}
        if reproduction:
            media["reproduction"] = wandb.Table(columns=RUN_COLUMNS, data=reproduction)
        for name, label in (("dice", "Dice"), ("iou", "IoU")):
            if graded:
                media[f"curves/{name}"] = wandb.plot.line_series(
                    xs=thresholds, ys=[results["grounding"]["curves"][key][name] for key in graded],
                    keys=[finding_display(results, key) for key in graded],
                    title=f"{label} vs threshold τ (mean over pairs)",
                    xname="τ",
                )
        if (results.get("gaze") or {}).get("applicable"):
            media["gaze/per_class"] = wandb.Table(*gaze_rows(results))
        gaze = "gaze" in overlays
        panel = wandb.Table(columns=["image_id", "finding", "overlay", *(["gaze"] if gaze else [])])
        for i in range(len(overlays["image_id"])):
            rgb = overlay_rgb(overlays["image"][i], overlays["saliency"][i], overlays["mask"][i])
            finding = finding_display(results, str(overlays["finding"][i]))
            where = f"{finding}, {overlays['image_id'][i]}"
            row = [str(overlays["image_id"][i]), finding, wandb.Image(rgb, caption=f"{where} (white: region)")]
            if gaze:  # the radiologist's gaze density over the radiograph (the radiograph alone where it has none)
                density = overlays["gaze"][i] if overlays["has_gaze"][i] else None
                row.append(wandb.Image(overlay_rgb(overlays["image"][i], density, overlays["mask"][i]),
                                       caption=f"{where}: the radiologist's gaze"))
            panel.add_data(*row)
        media["overlays"] = panel
        run.log(media)


def finish_runs(loggers: list[Logger]) -> list[str]:
    """Close the W&B runs of ``loggers`` so that the offline files are complete and a next run in
    the same process starts its own; return a line per run saying where it is."""
    places = []
    for logger in wandb_loggers(loggers):
        run = logger.experiment
        if run.settings.mode in ("offline", "dryrun"):
            folder = run.settings.sync_dir
            places.append(f"W&B run saved offline in {folder} (upload it with `wandb sync {folder}`)")
        elif run.url:
            places.append(f"W&B run: {run.url}")
        run.finish()
    return places


def abandon_runs(loggers: list[Logger]) -> None:
    """Close the W&B runs a failed run had started (marked failed), so that the next run in the
    same process does not write into them; a run never started is not created here."""
    for logger in wandb_loggers(loggers):
        if getattr(logger, "_experiment", None) is not None:
            logger.experiment.finish(exit_code=1)
