"""Console tables never cut a number or a header: rendered piped (no terminal) at 60 and 80
columns, every value of a run's summary is printed whole (rich's own shrinking printed ``Pai…`` and
``16…`` at 80 columns)."""

from __future__ import annotations

import io
import re

import pytest
from rich.console import Console

from conftest import names
from xbench.console import print_table
from xbench.metrics.names import metric, run_keys
from xbench.reporting.summary import print_summary, summary_tables

#: Three findings whose display names are long (VinDr's "Interstitial lung disease": 25 characters).
CLASSES = ["interstitial_lung_disease", "pleural_thickening", "nodule"]


def value(name: str, row: int):
    """A value of the unit of metric ``name``, as wide as such a value gets."""
    unit = metric(name).unit
    return 123456 + row if unit == "count" else 0.5 + row / 10 if unit in ("threshold", "ratio") else 0.987 - row / 100


def payload() -> dict:
    grounding = run_keys("grounding", "per_class")
    classification = run_keys("classification", "per_class")
    return {
        "model": "medklip", "dataset": "vindr", "classes": CLASSES,
        "grounding": {"per_class": {key: {n: value(n, r) for n in grounding} for r, key in enumerate(CLASSES)},
                      "macro": {n: value(n, 9) for n in run_keys("grounding", "macro")}},
        "classification": {"calibrated_logits": True,
                           "per_class": {key: {n: value(n, r) for n in classification} for r, key in enumerate(CLASSES)},
                           "macro": {n: value(n, 9) for n in run_keys("classification", "macro")}},
        "data": {"images_evaluated": 3000, "images_in_split": 3000, "clipped_shapes": 0,
                 "lost_regions": dict.fromkeys(CLASSES, 0)},
        "phrase_grounding": None,
        "names": names("MedKLIP", "vindr", CLASSES),
    }


def piped(width: int) -> Console:
    return Console(file=io.StringIO(), width=width, force_terminal=False, color_system=None)


@pytest.mark.parametrize("width", [60, 80])
def test_a_run_summary_keeps_every_number_and_header_whole(width):
    console = piped(width)
    results = payload()
    print_summary(results, None, [], console)
    out = console.file.getvalue()
    assert "…" not in out
    assert max(len(line) for line in out.splitlines()) <= width
    cells = re.findall(r"[^\s│┃]+(?: [^\s│┃]+)*", out)  # what stands between the table's rules
    for _, headers, rows in summary_tables(results):
        for header in headers[1:]:
            assert header in cells, (header, out)
        for row in rows:
            for cell in row[1:]:
                assert cell == "" or cell in cells, (cell, out)
    for name in ("Interstitial", "Lung", "Disease", "Pleural", "Thickening"):  # a long name, whole or folded
        assert name in out


def test_columns_that_fit_stay_in_one_table():
    console = piped(200)
    print_table(console, "T", ("Finding", "Pairs", "PG"), [["Nodule", "12", "61.6"], ["Macro mean", "12", "61.6"]],
                total_row=True)
    out = console.file.getvalue()
    assert out.count("Finding") == 1 and "(1/2)" not in out


def test_too_narrow_for_any_grid_prints_lines():
    console = piped(16)
    print_table(console, "T", ("Finding", "Dice@τ*"), [["Interstitial lung disease", "98.7"]])
    out = console.file.getvalue()
    assert "  Dice@τ*: 98.7" in out and "…" not in out


def test_free_text_columns_fold_and_keep_the_rest(tmp_path):
    console = piped(60)
    detail = "/a/very/long/path/that/does/not/fit/" * 3
    print_table(console, "Suite", ("#", "Model", "Dataset", "Status", "Path / detail"),
                [("1", "medklip", "chestx_det10", "[green]run", detail)], labels=5, fold=(4,))
    out = console.file.getvalue()
    assert "…" not in out and "medklip" in out and "chestx_det10" in out
    assert "".join(re.findall(r"[a-z/]+", out.split("Path / detail", 1)[1])).count("/a/very/long/path") == 3
