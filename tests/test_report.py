"""The report: tables and figures from hand-written results folders with known numbers."""

from __future__ import annotations

import csv
import io
import json
from pathlib import Path

import numpy as np
import pytest
from PIL import Image

from conftest import names, reseal
from xbench.report import main as report_main
from xbench.reporting.benchmark import Benchmark, perturbation_label
from xbench.reporting.explanations import cascade_figures
from xbench.reporting.figures import (
    DPI, dice_curves, dice_gap, linear_fit, overlay_grids, overlay_rgb, recognition_vs_grounding, robustness,
)
from xbench.reporting.paper_tables import (
    grounding_fixed_tau_table, grounding_table, pointing_game_tables, recognition_table, robustness_table,
)
from xbench.reporting.render import to_csv, to_latex, to_markdown
from xbench.reporting.table import Cell, Column, Row, Table, emphasis
from xbench.results.folder import SCHEMA

DET10 = ["atelectasis", "calcification", "nodule"]
THRESHOLDS = [k / 100 for k in range(101)]


def write_run(root: Path, model: str, dataset: str, classes: list[str], *, pointing: list[float | None],
              dice_fixed: float, dice_best: float, iou_best: float, auroc: float | None,
              created: str = "2026-01-01T00:00:00+00:00",
              class_name: str | None = None, curve_peak: float = 0.5, folder: str | None = None) -> Path:
    """A minimal ``metrics.json`` (only what the report reads), with the given numbers."""
    graded = [p for p in pointing if p is not None]
    curve = [max(0.0, dice_best * (1 - abs(t - curve_peak))) for t in THRESHOLDS]
    payload = {
        "schema": SCHEMA, "model": model, "dataset": dataset, "created": created, "classes": classes,
        "thresholds": THRESHOLDS,
        "grounding": {
            "macro": {"pointing_game": sum(graded) / len(graded) if graded else None, "dice@0.5": dice_fixed,
                      "dice@best": dice_best, "iou@0.5": dice_fixed / 2, "iou@best": iou_best},
            "per_class": {key: {"pairs": 0 if p is None else 4, "pointing_game": p}
                          for key, p in zip(classes, pointing)},
            "curves": {key: {"dice": curve, "iou": curve} for key in classes},
        },
        "classification": {"macro": {"auroc": auroc, "auprc": 0.25, "f1@0.5": 0.5, "accuracy@0.5": 0.75,
                                     "max_f1": 0.625, "accuracy@max_f1": 0.875}},
        "data": {"images_evaluated": 10, "images_in_split": 10},
        "config": {"model": {"class_path": f"somewhere.{class_name or model.title()}"}},
        "names": names(class_name or model.title(), dataset, classes),
    }
    path = root / (folder or f"{model}__{dataset}__1")
    path.mkdir(parents=True)
    (path / "metrics.json").write_text(json.dumps(payload))
    reseal(path)
    return path


@pytest.fixture
def bench_dir(tmp_path) -> Path:
    """Three models on ChestX-Det10 (3 classes), two of them on RSNA; c's older run is superseded."""
    root = tmp_path / "results"
    write_run(root, "a", "chestx_det10", DET10, pointing=[0.5, 0.25, 0.75], dice_fixed=0.125, dice_best=0.25,
              iou_best=0.125, auroc=0.625)
    write_run(root, "b", "chestx_det10", DET10, pointing=[0.75, 0.5, 1.0], dice_fixed=0.25, dice_best=0.375,
              iou_best=0.25, auroc=0.75, class_name="BModel")
    write_run(root, "c", "chestx_det10", DET10, pointing=[0.5, 0.5, None], dice_fixed=0.0625, dice_best=0.5,
              iou_best=0.25, auroc=0.875, created="2026-01-02T00:00:00+00:00", folder="c__chestx_det10__new")
    write_run(root / "old", "c", "chestx_det10", DET10, pointing=[0.0, 0.0, 0.0], dice_fixed=0.0, dice_best=0.0,
              iou_best=0.0, auroc=0.5, created="2025-12-01T00:00:00+00:00")
    write_run(root, "a", "rsna", ["pneumonia"], pointing=[0.5], dice_fixed=0.25, dice_best=0.5, iou_best=0.375,
              auroc=None)
    write_run(root, "b", "rsna", ["pneumonia"], pointing=[0.625], dice_fixed=0.125, dice_best=0.25, iou_best=0.125,
              auroc=0.5, class_name="BModel")
    return root


def markdown_grid(text: str) -> list[list[str]]:
    rows = [line for line in text.splitlines() if line.startswith("|")]
    return [[cell.strip() for cell in row.strip("|").split("|")] for row in rows[:1] + rows[2:]]


def test_newest_run_per_pair_and_paper_order(bench_dir):
    bench = Benchmark.from_folders([bench_dir])
    assert bench.datasets == ["rsna", "chestx_det10"]  # the paper's order, not alphabetical
    assert bench.models == ["a", "b", "c"]
    assert bench.get("c", "chestx_det10").folder.name == "c__chestx_det10__new"
    assert [run.folder.parent.name for run in bench.superseded] == ["old"]
    assert [bench.model_label(m) for m in bench.models] == ["A", "BModel", "C"]


def test_table1_cells_and_emphasis(bench_dir):
    table = grounding_table(Benchmark.from_folders([bench_dir]))
    grid = markdown_grid(to_markdown(table, 1))
    assert grid[0] == ["Model", "RSNA Pneumonia<br>PG", "RSNA Pneumonia<br>Dice@τ*", "RSNA Pneumonia<br>IoU@τ*",
                       "ChestX-Det10<br>PG", "ChestX-Det10<br>Dice@τ*", "ChestX-Det10<br>IoU@τ*"]
    # RSNA: only a and b ran -> the best is bold, nobody is underlined; c has no values.
    # ChestX-Det10 PG: a 50.0, b 75.0, c 50.0 (its class without pairs is left out) -> b bold; a and c share
    # rank 2 but nothing lies below them, so they are not "second best". Dice@τ*: c 50.0 > b 37.5 > a 25.0.
    # IoU@τ*: b and c tie at 25.0 (both bold, rank 1), a 12.5 has rank 3: no second.
    assert grid[1] == ["A", "50.0", "**50.0**", "**37.5**", "50.0", "25.0", "12.5"]
    assert grid[2] == ["BModel", "**62.5**", "25.0", "12.5", "**75.0**", "<ins>37.5</ins>", "**25.0**"]
    assert grid[3] == ["C", "–", "–", "–", "50.0", "**50.0**", "**25.0**"]
    latex = to_latex(table)
    assert r"BModel & \textbf{62.5} & 25.0 & 12.5 & \textbf{75.0} & \underline{37.5} & \textbf{25.0} \\" in latex
    assert r"\multicolumn{3}{c}{RSNA Pneumonia}" in latex and r"Dice@$\tau^*$" in latex
    rows = list(csv.reader(io.StringIO(to_csv(table))))
    assert rows[0][:3] == ["Model", "RSNA Pneumonia PG", "RSNA Pneumonia Dice@τ*"]
    assert [float(v) for v in rows[2][1:]] == [62.5, 25.0, 12.5, 75.0, 37.5, 25.0]
    assert rows[3][1:4] == ["", "", ""]
    assert "chosen on the evaluated set" in table.caption.lower()


def test_fixed_tau_twin_and_per_class_tables(bench_dir):
    bench = Benchmark.from_folders([bench_dir])
    fixed = markdown_grid(to_markdown(grounding_fixed_tau_table(bench)))
    assert fixed[1] == ["A", "**25.0**", "**12.5**", "<ins>12.5</ins>", "<ins>6.2</ins>"]
    assert fixed[2] == ["BModel", "12.5", "6.2", "**25.0**", "**12.5**"]
    (det10,) = pointing_game_tables(bench)  # RSNA has one class: no per-class table
    grid = markdown_grid(to_markdown(det10))
    assert grid[0] == ["Model", "ATE", "CAL", "NOD", "Mean"]
    # ties share a rank: a tie for the best leaves no second; values tied at the bottom are not marked
    assert grid[1] == ["A", "50.0", "25.0", "75.0", "50.0"]
    assert grid[2] == ["BModel", "**75.0**", "**50.0**", "**100.0**", "**75.0**"]
    assert grid[3] == ["C", "50.0", "**50.0**", "–", "50.0"]
    assert "ATE = Atelectasis" in det10.caption


def test_ties_share_a_rank_and_a_ceiling_row_is_never_ranked():
    values = [0.75, 0.5, 0.5, 0.25, None]
    column = lambda *cells: Table("t", "T", "", "Model", (Column("PG"),),  # noqa: E731
                                  tuple(Row(str(i), (Cell(v),), ceiling=i == 9) for i, v in cells))
    marks = [row[0] for row in emphasis(column(*enumerate(values)))]
    assert marks == ["best", "second", "second", None, None]
    assert [row[0] for row in emphasis(column((0, 0.0), (1, 0.0), (2, 0.0)))] == [None] * 3  # all equal: no best
    assert [row[0] for row in emphasis(column((0, 0.5), (1, 0.0), (2, 0.0)))] == ["best", None, None]
    # an Oracle at 100 takes neither the bold nor a place in the ranking, and reads as the ceiling
    table = column((0, 0.5), (1, 0.25), (2, 0.125), (9, 1.0))
    assert [row[0] for row in emphasis(table)] == ["best", "second", None, None]
    assert markdown_grid(to_markdown(table))[-1] == ["*9*", "100.0"]


def test_an_instrument_is_the_ceiling_row_of_every_table_and_no_point_of_fig3(bench_dir):
    oracle = write_run(bench_dir, "oracle", "chestx_det10", DET10, pointing=[1.0, 1.0, 1.0], dice_fixed=1.0,
                       dice_best=1.0, iou_best=1.0, auroc=1.0)
    payload = json.loads((oracle / "metrics.json").read_text())
    (oracle / "metrics.json").write_text(json.dumps({**payload, "instrument": True}))
    reseal(oracle)
    bench = Benchmark.from_folders([bench_dir])
    assert bench.models == ["a", "b", "c"] and bench.instruments == ["oracle"]
    grid = markdown_grid(to_markdown(grounding_table(bench)))
    assert grid[-1] == ["*Oracle (ceiling)*", "–", "–", "–", "100.0", "100.0", "100.0"]
    assert grid[2][4] == "**75.0**"  # b keeps the best PG on ChestX-Det10
    recognition = markdown_grid(to_markdown(recognition_table(bench)))
    assert recognition[-1][:2] == ["*Oracle (ceiling)*", "100.0"] and recognition[-2][1] == "**87.5**"
    assert "ceiling" in grounding_table(bench).caption
    plot = recognition_vs_grounding(bench)
    assert "n = 4 points" in plot.caption  # 3 models on ChestX-Det10 + 1 on RSNA with an AUROC; no Oracle


def test_recognition_table_groups_by_dataset(bench_dir):
    table = recognition_table(Benchmark.from_folders([bench_dir]))
    grid = markdown_grid(to_markdown(table))
    assert grid[0] == ["Model", "AUROC", "AUPRC", "F1@p≥0.5", "Acc@p≥0.5", "max-F1*", "Acc@max-F1*"]
    assert grid[1][0] == "*RSNA Pneumonia*"
    assert grid[2][:2] == ["A", "–"] and grid[3][:2] == ["BModel", "50.0"]  # one value: nothing to rank
    assert grid[4][0] == "*ChestX-Det10*"
    assert [row[1] for row in grid[5:8]] == ["62.5", "<ins>75.0</ins>", "**87.5**"]
    assert "max-F1" in table.caption and "chosen on the evaluated set" in table.caption.lower()
    rows = list(csv.reader(io.StringIO(to_csv(table))))
    assert rows[0][:3] == ["group", "Model", "AUROC"] and rows[5][:3] == ["ChestX-Det10", "C", "87.5"]


def test_a_cell_carries_an_interval_in_every_format():
    table = Table("t", "T", "caption", "Model", (Column("PG", "Set"), Column("Dice")),
                  (Row("x", (Cell(0.5, (0.375, 0.625)), Cell(0.25))), Row("y", (Cell(0.75, (0.5, 1.0)), Cell(None)))))
    grid = markdown_grid(to_markdown(table))
    assert grid[1] == ["x", "50.0 [37.5, 62.5]", "25.0"]
    assert grid[2] == ["y", "**75.0 [50.0, 100.0]**", "–"]
    rows = list(csv.reader(io.StringIO(to_csv(table))))
    assert rows[0] == ["Model", "Set PG", "Set PG low", "Set PG high", "Dice"]
    assert rows[1] == ["x", "50.0", "37.5", "62.5", "25.0"]
    assert r"\textbf{75.0 [50.0, 100.0]}" in to_latex(table)


def test_unranked_and_ratio_columns():
    """Differences are not ranked; a ratio column (R²) prints two decimals and is not scaled in CSV."""
    table = Table("t", "T", "caption", "A − B", (Column("Δ", ranked=False), Column("R²", percent=False)),
                  (Row("a − b", (Cell(-0.125, (-0.25, 0.0)), Cell(0.5, (0.25, 0.75)))),
                   Row("a − c", (Cell(0.25), Cell(float("nan"))))))
    grid = markdown_grid(to_markdown(table))
    assert grid[1] == ["a − b", "-12.5 [-25.0, 0.0]", "0.50 [0.25, 0.75]"]  # one value in R²: nothing to rank
    assert grid[2] == ["a − c", "25.0", "–"]
    rows = list(csv.reader(io.StringIO(to_csv(table))))
    assert rows[1] == ["a − b", "-12.5", "-25.0", "0.0", "0.5", "0.25", "0.75"] and rows[2][4:] == ["", "", ""]
    assert r"a $-$ b & -12.5 [-25.0, 0.0] & 0.50 [0.25, 0.75] \\" in to_latex(table)


# -- robustness ----------------------------------------------------------------------------------

ROTATE = [{"class_path": "albumentations.Rotate", "init_args": {"limit": 10, "p": 1.0, "border_mode": 0}}]
NOISE = [{"class_path": "albumentations.GaussNoise", "init_args": {"std_range": [0.02, 0.05], "p": 0.5}}]


def write_perturbed(root: Path, model: str, augment, *, pointing: float, dice: float, auroc: float, lost: int = 0,
                    created: str = "2026-02-01T00:00:00+00:00") -> Path:
    """A robustness run: the metrics.json of ``write_run`` with the augment pipeline in its config."""
    name = f"{model}__chestx_det10__{len(list(root.glob('*')))}" if root.exists() else f"{model}__chestx_det10__0"
    path = write_run(root, model, "chestx_det10", DET10, pointing=[pointing] * 3, dice_fixed=dice, dice_best=dice,
                     iou_best=dice / 2, auroc=auroc, created=created, folder=name)
    payload = json.loads((path / "metrics.json").read_text())
    payload["config"]["data"] = {"class_path": "x.Data", "init_args": {"augment": augment, "augment_seed": 0}}
    payload["data"]["lost_regions"] = {"nodule": lost, "mass": 0}
    (path / "metrics.json").write_text(json.dumps(payload))
    reseal(path)
    return path


@pytest.fixture
def robustness_dir(bench_dir) -> Path:
    """bench_dir, plus model a under a rotation (2 regions lost) and under noise (p = 0.5); model d only perturbed."""
    write_perturbed(bench_dir, "a", ROTATE, pointing=0.25, dice=0.0625, auroc=0.5, lost=2)
    write_perturbed(bench_dir, "a", NOISE, pointing=0.375, dice=0.125, auroc=0.75)
    write_perturbed(bench_dir, "d", NOISE, pointing=0.5, dice=0.25, auroc=0.625)
    return bench_dir


def test_perturbation_labels_name_the_pipeline():
    assert perturbation_label(None) is None
    assert perturbation_label(ROTATE) == "Rotate(limit=10, border_mode=0)"  # p = 1: always applied, left out
    assert perturbation_label(NOISE + ROTATE, seed=3) == (
        "GaussNoise(std_range=[0.02, 0.05], p=0.5) + Rotate(limit=10, border_mode=0), seed 3")
    serialised = {"transform": {"__class_fullname__": "Compose", "p": 1.0, "transforms": [
        {"__class_fullname__": "Rotate", "limit": [-10, 10], "p": 1.0}]}}
    assert perturbation_label(serialised) == "Rotate(limit=[-10, 10])"


def test_robustness_runs_stay_apart_from_the_benchmark(robustness_dir):
    bench = Benchmark.from_folders([robustness_dir])
    # the newer perturbed runs of a do not supersede its benchmark run; d has no benchmark run
    assert bench.get("a", "chestx_det10").folder.name == "a__chestx_det10__1"
    assert bench.models == ["a", "b", "c"] and len(bench.perturbed) == 3
    assert [run.folder.parent.name for run in bench.superseded] == ["old"]
    assert bench.robustness_pairs() == [("a", "chestx_det10"), ("d", "chestx_det10")]
    assert [p for p, _ in bench.robustness_runs("a", "chestx_det10")] == [
        None, "GaussNoise(std_range=[0.02, 0.05], p=0.5)", "Rotate(limit=10, border_mode=0)"]
    table = grounding_table(bench)
    assert markdown_grid(to_markdown(table))[1][5] == "25.0"  # a's Dice@τ* on ChestX-Det10: the reference


def test_robustness_table_lists_each_perturbation_under_its_reference(robustness_dir):
    table = robustness_table(Benchmark.from_folders([robustness_dir]))
    grid = markdown_grid(to_markdown(table))
    assert grid[0] == ["Perturbation", "PG", "Dice@0.5", "Dice@τ*", "AUROC", "AUPRC"]
    assert grid[1:] == [
        ["*A on ChestX-Det10*", "", "", "", "", ""],
        ["unperturbed (reference)", "50.0", "12.5", "25.0", "62.5", "25.0"],
        ["GaussNoise(std_range=[0.02, 0.05], p=0.5)", "37.5", "12.5", "12.5", "75.0", "25.0"],
        ["Rotate(limit=10, border_mode=0)", "25.0", "6.2", "6.2", "50.0", "25.0"],
        ["*D on ChestX-Det10*", "", "", "", "", ""],
        ["GaussNoise(std_range=[0.02, 0.05], p=0.5)", "50.0", "25.0", "25.0", "62.5", "25.0"],
    ]  # nothing bold: perturbations are not ranked
    assert "2 under Rotate(limit=10, border_mode=0) (A on ChestX-Det10)" in table.caption
    assert robustness_table(Benchmark.from_folders([robustness_dir / "old"])) is None


def test_robustness_figure_places_every_run(robustness_dir, tmp_path):
    plot = robustness(Benchmark.from_folders([robustness_dir]))
    pg, dice, auroc = plot.figure.axes[:3]
    assert [t.get_text() for t in pg.get_yticklabels()] == [
        "unperturbed (reference)", "GaussNoise\nstd_range=[0.02, 0.05],\np=0.5", "Rotate\nlimit=10, border_mode=0"]
    assert pg.get_ylim()[0] > pg.get_ylim()[1]  # the reference on top
    (a, d) = pg.collections
    # a: the reference on row 0, noise on row 1, rotation on row 2; the two models drawn 0.075 apart of each row
    np.testing.assert_allclose(a.get_offsets(), [[50.0, -0.075], [37.5, 0.925], [25.0, 1.925]])
    np.testing.assert_allclose(d.get_offsets(), [[50.0, 1.075]])
    np.testing.assert_allclose(auroc.collections[0].get_offsets()[:, 0], [62.5, 75.0, 50.0])
    # a's reference value as a vertical dotted line; d has no reference run, so no line
    verticals = [line for line in dice.lines if line.get_linestyle() == ":"]
    assert [line.get_xdata()[0] for line in verticals] == [12.5]
    assert auroc.get_xlim() == (-3, 100)
    assert "2 under Rotate(limit=10, border_mode=0)" in plot.caption
    png_size(plot.figure, tmp_path / "robustness.png")
    assert_texts_apart(plot.figure)


# -- figures -----------------------------------------------------------------------------------


def test_linear_fit_matches_numpy():
    rng = np.random.default_rng(4)
    x = rng.uniform(50, 90, 23)
    y = 0.8 * x + rng.normal(0, 6, 23)
    slope, intercept = np.polyfit(x, y, 1)
    r2 = 1 - np.sum((y - np.polyval([slope, intercept], x)) ** 2) / np.sum((y - y.mean()) ** 2)
    fit = linear_fit(x, y)
    assert fit.slope == pytest.approx(slope, rel=1e-10) and fit.intercept == pytest.approx(intercept, rel=1e-10)
    assert fit.r2 == pytest.approx(r2, rel=1e-10) and fit.n == 23
    assert linear_fit(x[:1], y[:1]) is None and linear_fit(np.ones(4), y[:4]) is None


def png_size(figure, path: Path) -> tuple[int, int]:
    figure.savefig(path, dpi=DPI)
    with Image.open(path) as image:
        image.verify()
    with Image.open(path) as image:
        assert image.format == "PNG"
        return image.size


def test_recognition_vs_grounding_points_line_and_r2(bench_dir, tmp_path):
    bench = Benchmark.from_folders([bench_dir])
    plot = recognition_vs_grounding(bench)
    ax = plot.figure.axes[0]
    points = np.concatenate([c.get_offsets() for c in ax.collections])
    # 5 runs; a on RSNA has no AUROC and is left out
    expected = np.array([[62.5, 50.0], [75.0, 75.0], [87.5, 50.0], [50.0, 62.5]])
    assert sorted(map(tuple, points)) == sorted(map(tuple, expected))
    slope, intercept = np.polyfit(expected[:, 0], expected[:, 1], 1)
    r2 = np.corrcoef(expected[:, 0], expected[:, 1])[0, 1] ** 2
    (line,) = ax.lines
    np.testing.assert_allclose(line.get_ydata(), slope * line.get_xdata() + intercept)
    assert np.array_equal(line.get_xdata(), [50.0, 87.5])
    assert any(f"R² = {r2:.2f}  (n = 4)" in text.get_text() for text in ax.texts)
    assert "A on RSNA Pneumonia" in plot.caption
    assert png_size(plot.figure, tmp_path / "f.png") == (7 * DPI, round(4.2 * DPI))
    assert_texts_apart(plot.figure)


def test_dice_gap_and_curves(bench_dir, tmp_path):
    bench = Benchmark.from_folders([bench_dir])
    gap = dice_gap(bench)
    rsna, det10 = [ax for ax in gap.figure.axes if ax.get_visible()]
    assert rsna.get_title() == "RSNA Pneumonia" and det10.get_title() == "ChestX-Det10"
    heights = [round(p.get_height(), 6) for p in det10.patches]
    assert heights == [12.5, 25.0, 6.25, 25.0, 37.5, 50.0]  # fixed bars of a, b, c, then best-τ bars
    assert sorted(t.get_text() for t in det10.texts) == ["Δ +12.5", "Δ +12.5", "Δ +43.8"]
    assert "chosen on the evaluated set" in gap.caption
    width, height = png_size(gap.figure, tmp_path / "gap.png")
    assert (width, height) == tuple(round(v * DPI) for v in gap.figure.get_size_inches())

    curves = dice_curves(bench)
    rsna, det10 = [ax for ax in curves.figure.axes if ax.get_visible()]
    model_lines = [line for line in det10.lines if len(line.get_xdata()) == 101]
    assert len(model_lines) == 3
    # model c: its class without pairs is left out of the mean curve
    expected = 100 * np.array([max(0.0, 0.5 * (1 - abs(t - 0.5))) for t in THRESHOLDS])
    np.testing.assert_allclose(model_lines[2].get_ydata(), expected)
    assert len([line for line in rsna.lines if len(line.get_xdata()) == 101]) == 2
    assert_texts_apart(gap.figure)
    assert_texts_apart(curves.figure)


def drawn_texts(figure) -> list:
    """Every text a render of ``figure`` shows, with its box in pixels: titles, axis labels, legend
    entries, captions, and the tick labels inside the view of each axis that is drawn."""
    from matplotlib.backends.backend_agg import FigureCanvasAgg
    from matplotlib.text import Text

    canvas = FigureCanvasAgg(figure)
    canvas.draw()
    renderer = canvas.get_renderer()
    shown, axis_texts = [], set()
    for ax in figure.axes:
        for axis in (ax.xaxis, ax.yaxis):
            axis_texts.update(axis.findobj(Text))
            if not (ax.get_visible() and ax.axison and axis.get_visible()):
                continue
            low, high = sorted(axis.get_view_interval())
            shown += [tick.label1 for tick, loc in zip(axis.get_major_ticks(), axis.get_majorticklocs())
                      if low <= loc <= high and tick.label1.get_visible()]
            shown.append(axis.label)
    shown += [text for text in figure.findobj(Text) if text not in axis_texts and text.get_visible()]
    return [(text.get_text(), text.get_window_extent(renderer)) for text in shown if text.get_text().strip()]


def assert_texts_apart(figure) -> None:
    """No two shown texts of ``figure`` overlap (by more than a pixel) and none leaves the figure."""
    texts = drawn_texts(figure)
    width, height = figure.canvas.get_width_height()
    outside = [text for text, box in texts if box.x0 < -1 or box.y0 < -1 or box.x1 > width + 1 or box.y1 > height + 1]
    assert not outside, f"texts outside the figure: {outside}"
    overlaps = [(a, b) for i, (a, one) in enumerate(texts) for b, other in texts[i + 1:]
                if one.x0 < other.x1 - 1 and other.x0 < one.x1 - 1 and one.y0 < other.y1 - 1 and other.y0 < one.y1 - 1]
    assert not overlaps, f"overlapping texts: {overlaps}"


def write_sanity_run(root: Path, *, absolute_scale: float = 1.0) -> Path:
    """A run with the sanity check, a ViT's 14-step cascade (layer names as long as a real model's)
    and its saved strip; the Spearman of absolute values is ``absolute_scale`` times the plain one."""
    folder = write_run(root, "clip", "rsna", ["pneumonia"], pointing=[0.5], dice_fixed=0.25, dice_best=0.5,
                       iou_best=0.375, auroc=0.75)
    layers = ["original", "projections", *(f"image tower: block {b}" for b in range(11, -1, -1)),
              "image tower: other layers"]
    steps = [{"step": k, "layers": name, "parameters": k, "spearman": 1 - k / 15,
              "spearman_abs": absolute_scale * (1 - k / 15), "ssim": 0.9 * (1 - k / 15),
              "grounding": {"pointing_game": 0.5, "dice@0.5": 0.25, "iou@0.5": 0.125}}
             for k, name in enumerate(layers)]
    payload = json.loads((folder / "metrics.json").read_text())
    last = {key: steps[-1][key] for key in ("spearman", "spearman_abs", "ssim")}
    payload["sanity"] = {"applicable": True, "images": 1, "pairs": 1, "seed": 0, "steps": steps, "macro": last,
                         "per_class": {"pneumonia": {"pairs": 1, **last}}}
    (folder / "metrics.json").write_text(json.dumps(payload))
    reseal(folder)
    rng = np.random.default_rng(0)
    np.savez_compressed(folder / "sanity_maps.npz", image_id=np.array("img1"), finding=np.array("pneumonia"),
                        image=np.full((16, 16), 100, np.uint8), mask=np.zeros((16, 16), np.uint8),
                        maps=rng.integers(0, 256, (len(layers), 16, 16), dtype=np.uint8), layers=np.array(layers))
    return reseal(folder)


@pytest.mark.parametrize(("absolute_scale", "strip"), [(1.0, True), (0.5, True), (1.0, False)])
def test_sanity_figure_is_legible(tmp_path, absolute_scale, strip):
    """The cascade figure's panel titles, step labels and legend never overlap (with the strip of maps
    and without), and its two Spearman curves are told apart: a different line and marker, and where
    they coincide the legend and caption say so (else they do not)."""
    folder = write_sanity_run(tmp_path / "results", absolute_scale=absolute_scale)
    if not strip:
        (folder / "sanity_maps.npz").unlink()
        reseal(folder)
    (plot,) = cascade_figures(Benchmark.from_folders([tmp_path / "results"]))
    assert_texts_apart(plot.figure)
    curves = plot.figure.axes[-1]
    (plain,) = [line for line in curves.lines if line.get_label() == "Spearman"]
    (absolute,) = [line for line in curves.lines if line.get_label().startswith("Spearman (abs)")]
    assert (plain.get_linestyle(), plain.get_marker()) != (absolute.get_linestyle(), absolute.get_marker())
    coincide = absolute_scale == 1.0
    assert (absolute.get_label() == "Spearman (abs): same as Spearman") == coincide
    assert ("The two Spearman curves coincide here" in plot.caption) == coincide


def test_overlay_rgb_outlines_the_region_in_white():
    image = np.full((12, 12), 100, dtype=np.uint8)
    saliency = np.zeros((12, 12), dtype=np.uint8)
    saliency[0, 0] = 255
    mask = np.zeros((12, 12), dtype=bool)
    mask[3:9, 4:10] = True
    rgb = overlay_rgb(image, saliency, mask)
    # border: mask pixels with a 4-neighbour outside; then grown by one pixel (4-neighbourhood)
    border = {(y, x) for y in range(12) for x in range(12) if mask[y, x]
              and not all(mask[y + dy, x + dx] for dy, dx in ((-1, 0), (1, 0), (0, -1), (0, 1)))}
    grown = border | {(y + dy, x + dx) for y, x in border for dy, dx in ((-1, 0), (1, 0), (0, -1), (0, 1))}
    white = {(y, x) for y in range(12) for x in range(12) if (rgb[y, x] == 255).all()}
    assert white == grown
    assert not (rgb[0, 0] == rgb[11, 11]).all()  # the heat map changes the colour where saliency is high
    plain = overlay_rgb(image, None, np.zeros((12, 12), dtype=bool))
    assert (plain == 100).all()


def write_overlays(folder: Path, pairs: list[tuple[str, str]], seed: int) -> None:
    rng = np.random.default_rng(seed)
    n = len(pairs)
    images = np.stack([np.full((8, 8), 10 * (i + 1), dtype=np.uint8) for i, _ in enumerate(pairs)])
    np.savez_compressed(
        folder / "overlays.npz", image_index=np.arange(n), image_id=np.array([i for _, i in pairs]),
        finding=np.array([f for f, _ in pairs]), image=images,
        saliency=rng.integers(0, 256, (n, 8, 8), dtype=np.uint8), mask=np.ones((n, 8, 8), dtype=bool),
    )
    reseal(folder)


def test_overlay_grid_shows_the_same_images_for_every_model(tmp_path):
    root = tmp_path / "results"
    a = write_run(root, "a", "chestx_det10", DET10, pointing=[0.5, 0.5, 0.5], dice_fixed=0.1, dice_best=0.2,
                  iou_best=0.1, auroc=0.5)
    b = write_run(root, "b", "chestx_det10", DET10, pointing=[0.5, 0.5, 0.5], dice_fixed=0.1, dice_best=0.2,
                  iou_best=0.1, auroc=0.5)
    write_overlays(a, [("atelectasis", "2.png"), ("atelectasis", "5.png"), ("nodule", "3.png")], seed=1)
    # b saved them in another order, and one pair a lacks (left out: not the same images)
    write_overlays(b, [("nodule", "3.png"), ("calcification", "1.png"), ("atelectasis", "5.png"),
                       ("atelectasis", "2.png")], seed=2)
    (plot,) = overlay_grids(Benchmark.from_folders([root]), max_columns=6)
    # rows: radiograph + 2 models; columns: the common pairs, up to 6 // 2 classes = 3 per class
    axes = np.array(plot.figure.axes[:-1]).reshape(3, -1)  # the last axes is the colour bar
    assert axes.shape == (3, 3)
    assert [ax.get_title().split("\n")[0] for ax in axes[0]] == ["Atelectasis", "Atelectasis", "Nodule"]
    overlays_a, overlays_b = (np.load(f / "overlays.npz") for f in (a, b))
    for c, (key, image_id) in enumerate([("atelectasis", "2.png"), ("atelectasis", "5.png"), ("nodule", "3.png")]):
        i = int(np.flatnonzero((overlays_a["finding"] == key) & (overlays_a["image_id"] == image_id))[0])
        j = int(np.flatnonzero((overlays_b["finding"] == key) & (overlays_b["image_id"] == image_id))[0])
        shown = [ax.images[0].get_array() for ax in axes[:, c]]
        np.testing.assert_array_equal(shown[0], overlay_rgb(overlays_a["image"][i], None, overlays_a["mask"][i]))
        np.testing.assert_array_equal(shown[1], overlay_rgb(overlays_a["image"][i], overlays_a["saliency"][i],
                                                            overlays_a["mask"][i]))
        np.testing.assert_array_equal(shown[2], overlay_rgb(overlays_b["image"][j], overlays_b["saliency"][j],
                                                            overlays_b["mask"][j]))
    assert "(1) ATE: 2.png; (2) ATE: 5.png; (3) NOD: 3.png" in plot.caption


def test_report_cli_writes_every_table_and_figure(robustness_dir, tmp_path, capsys):
    bench_dir = robustness_dir
    write_overlays(bench_dir / "a__chestx_det10__1", [("nodule", "9.png")], seed=0)
    write_overlays(bench_dir / "b__chestx_det10__1", [("nodule", "9.png")], seed=1)
    out = tmp_path / "report"
    files = report_main([str(bench_dir), "--out", str(out), "--no-analysis"])  # metrics.json only: no pairs
    names = sorted(str(p.relative_to(out)) for p in files)
    tables = ["grounding", "grounding_fixed_tau", "pointing_game_chestx_det10", "recognition", "robustness"]
    figures = ["dice_vs_tau", "fig2_overlays_chestx_det10", "fig3_auroc_vs_pointing_game",
               "fig4_dice_fixed_vs_best_tau", "robustness"]
    assert names == sorted(["report.md", *(f"tables/{t}.{s}" for t in tables for s in ("md", "csv", "tex")),
                            *(f"figures/{f}.png" for f in figures)])
    for name in figures:
        with Image.open(out / "figures" / f"{name}.png") as image:
            assert image.format == "PNG"
    report = (out / "report.md").read_text()
    assert "**Table 1: Grounding per model and dataset" in report and "**Table 4: Zero-shot recognition" in report
    assert "![Figure 4](figures/fig2_overlays_chestx_det10.png)" in report
    assert "**Table 5: Grounding and recognition under perturbation" in report
    assert "| A | ChestX-Det10 | Rotate(limit=10, border_mode=0) |" in report  # the runs, with their perturbation
    assert "Superseded" in report and "old" in report
    assert str(out / "report.md") in capsys.readouterr().out


def test_report_of_robustness_runs_alone(tmp_path):
    write_perturbed(tmp_path / "results", "d", NOISE, pointing=0.5, dice=0.25, auroc=0.625)
    files = report_main([str(tmp_path / "results"), "--out", str(tmp_path / "r")])  # nothing to analyse
    assert sorted(p.name for p in files) == ["report.md", "robustness.csv", "robustness.md", "robustness.png",
                                            "robustness.tex"]


def test_report_without_results_says_what_to_run(tmp_path):
    (tmp_path / "empty").mkdir()
    with pytest.raises(FileNotFoundError, match="python -m xbench.suite"):
        report_main([str(tmp_path / "empty"), "--out", str(tmp_path / "r")])


def test_report_rejects_another_schema(tmp_path):
    folder = write_run(tmp_path, "a", "rsna", ["pneumonia"], pointing=[0.5], dice_fixed=0.1, dice_best=0.2,
                       iou_best=0.1, auroc=0.5)
    payload = json.loads((folder / "metrics.json").read_text())
    payload["schema"] = "xbench.results/0"
    (folder / "metrics.json").write_text(json.dumps(payload))
    reseal(folder)
    with pytest.raises(ValueError, match=r"metrics.json: schema 'xbench.results/0'"):
        Benchmark.from_folders([tmp_path])


def test_the_header_counts_every_run_the_report_lists(tmp_path, robustness_dir, capsys):
    """Issue 32: the header said "from 2 runs (2 models, 1 datasets)" above three rows of runs: the
    Oracle's (a ceiling) went uncounted, and one dataset was plural."""
    root = tmp_path / "ceiling"
    for model in ("a", "b", "oracle"):
        folder = write_run(root, model, "rsna", ["pneumonia"], pointing=[0.5], dice_fixed=0.25, dice_best=0.5,
                           iou_best=0.375, auroc=0.5)
    payload = json.loads((folder / "metrics.json").read_text())
    (folder / "metrics.json").write_text(json.dumps({**payload, "instrument": True}))
    reseal(folder)
    report_main([str(root), "--out", str(tmp_path / "r"), "--no-analysis"])
    report = (tmp_path / "r" / "report.md").read_text()
    scope = "3 runs: 2 models and 1 ceiling instrument (oracle) on 1 dataset"
    assert f"from {scope}. All numbers" in report
    runs = report.split("## Runs", 1)[1]
    assert len([line for line in runs.splitlines() if line.startswith("| ") and "rsna" in line.lower()]) == 3
    assert f"Report of {scope} written to" in capsys.readouterr().out
    assert Benchmark.from_folders([robustness_dir]).scope() == "8 runs: 4 models on 2 datasets (3 robustness runs among them)"


def test_a_new_model_sits_beside_the_papers_published_rows(tmp_path):
    """``--published paper``: a model the paper never ran, on RSNA, in the report's own Table 1 beside
    the paper's seven, their values as printed (two decimals), in italics, unranked, without an
    interval; the datasets the results do not cover bring no columns, the tables without published
    values no rows, and the paper's rows are not judged (no run of theirs is needed)."""
    root = tmp_path / "results"
    write_run(root, "mine", "rsna", ["pneumonia"], pointing=[0.5], dice_fixed=0.25, dice_best=0.5, iou_best=0.375,
              auroc=0.75, class_name="My model")
    write_run(root, "other", "rsna", ["pneumonia"], pointing=[0.25], dice_fixed=0.125, dice_best=0.25,
              iou_best=0.125, auroc=0.5)
    out = tmp_path / "report"
    report_main([str(root), "--out", str(out), "--no-analysis", "--published", "paper"])
    grid = markdown_grid((out / "tables" / "grounding.md").read_text())
    assert grid[0] == ["Model", "RSNA Pneumonia<br>PG", "RSNA Pneumonia<br>Dice@τ*", "RSNA Pneumonia<br>IoU@τ*"]
    assert grid[1][:2] == ["My model", "**50.0**"]  # ranked among the runs only
    assert grid[3] == ["*CLIP (published)*", "7.39", "20.20", "11.97"]
    published = [row[0] for row in grid if row[0].endswith("(published)*")]
    assert sorted(published) == sorted(f"*{label} (published)*" for label in
                                       ("CLIP", "BiomedCLIP", "MedKLIP", "MAVL", "KAD", "DeViDe", "CARZero"))
    assert all("[" not in cell and "**" not in cell for row in grid[3:] for cell in row)
    text = (out / "tables" / "grounding.md").read_text()
    assert "marked (published): the values the paper (arXiv 2510.19599) publishes, as printed (to 2 decimals)" in text
    rows = {row[0]: row for row in csv.reader(io.StringIO((out / "tables" / "grounding.csv").read_text()))}
    medklip = next(row for row in grid if row[0] == "*MedKLIP (published)*")
    assert float(rows["MedKLIP (published)"][1]) == pytest.approx(float(medklip[1]))
    fixed = (out / "tables" / "grounding_fixed_tau.md").read_text()
    assert "(published)" not in fixed  # the paper prints no Dice at τ = 0.5
    assert "CLIP (published)" in (out / "report.md").read_text()


def test_published_values_from_a_csv_of_any_model(tmp_path):
    """``--published FILE``: the reference format, each value at its own stated decimals, a model
    these results never ran included (the gate's ``--reference`` would refuse it)."""
    root = tmp_path / "results"
    write_run(root, "mine", "rsna", ["pneumonia"], pointing=[0.5], dice_fixed=0.25, dice_best=0.5, iou_best=0.375,
              auroc=0.75)
    table = tmp_path / "published.csv"
    table.write_text("table,dataset,model,finding,metric,value_percent,decimals\n"
                     "A,rsna,their_model,mean,pointing_game,41.5,1\nA,rsna,their_model,mean,auroc,80,0\n"
                     "A,siim,their_model,mean,pointing_game,12.25,2\n")
    out = tmp_path / "report"
    report_main([str(root), "--out", str(out), "--no-analysis", "--published", str(table)])
    grid = markdown_grid((out / "tables" / "grounding.md").read_text())
    assert grid[-1] == ["*their_model (published)*", "41.5", "–", "–"]  # SIIM: not covered, no column
    recognition = markdown_grid((out / "tables" / "recognition.md").read_text())
    assert recognition[-1][:2] == ["*their_model (published)*", "80"]


def test_an_empty_explanation_value_says_it_scored_no_pair(tmp_path):
    """A check that ran on images without a graded pair scores no pair: its empty cells say so
    (``– (0 pairs)``) and the caption why, where a bare – read as a check not asked for; counts
    take their noun's number (``1 image``, ``1 noisy copy``)."""
    from xbench.console import counted
    from xbench.reporting.explanations import explanation_tables

    root = tmp_path / "results"
    folder = write_run(root, "a", "chestx_det10", DET10, pointing=[0.5, 0.25, 0.75], dice_fixed=0.125,
                       dice_best=0.25, iou_best=0.125, auroc=0.625)
    payload = json.loads((folder / "metrics.json").read_text())
    empty = {"deletion_auc": None, "insertion_auc": None, "road": None}
    payload["faithfulness"] = {"applicable": True, "images": 0, "pairs": 0, "constant_maps": 0, "macro": empty,
                               "per_class": {key: {"pairs": 0, **empty} for key in DET10}}
    (folder / "metrics.json").write_text(json.dumps(payload))
    reseal(folder)
    table = explanation_tables(Benchmark.from_folders([root]))[0]
    grid = markdown_grid(to_markdown(table))
    assert grid[2][3:6] == ["– (0 pairs)"] * 3  # deletion, insertion, ROAD (grid[1]: the dataset)
    assert grid[2][6:] == ["–", "–"]  # sanity: not asked for
    assert "– (0 pairs): the check ran but scored no (image, class) pair" in table.caption
    assert "faithfulness: 0 images" in table.caption
    assert [counted(n, "image") for n in (0, 1, 2)] == ["0 images", "1 image", "2 images"]
    assert [counted(n, "noisy copy", "noisy copies") for n in (1, 3)] == ["1 noisy copy", "3 noisy copies"]


def test_the_long_steps_show_a_progress_line_on_a_terminal_only(bench_dir, tmp_path, monkeypatch, capsys):
    """The report's long steps say what they do on stderr while they run -- on a terminal; stderr
    redirected to a log or a pipe gets no line of it."""
    import xbench.report
    from rich.console import Console

    report_main([str(bench_dir), "--out", str(tmp_path / "quiet"), "--no-analysis"])
    assert "Drawing" not in capsys.readouterr().err
    screen = io.StringIO()
    monkeypatch.setattr(xbench.report, "Console", lambda stderr: Console(file=screen, force_terminal=True))
    report_main([str(bench_dir), "--out", str(tmp_path / "shown"), "--no-analysis"])
    assert "Drawing the tables and figures..." in screen.getvalue()


def test_two_models_shown_alike_are_told_apart_by_their_names(tmp_path):
    """The tables show a run by the display name it wrote; two models that wrote the same one (two
    saved-output runs, say) are followed by each one's name, so no two rows read alike."""
    root = tmp_path / "results"
    for model in ("saved_a", "saved_b", "other"):
        write_run(root, model, "rsna", ["pneumonia"], pointing=[0.5], dice_fixed=0.25, dice_best=0.5,
                  iou_best=0.375, auroc=0.75, class_name="Other" if model == "other" else "Saved maps")
    bench = Benchmark.from_folders([root])
    assert [bench.model_label(m) for m in bench.models] == ["Other", "Saved maps (saved_a)", "Saved maps (saved_b)"]
