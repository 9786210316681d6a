"""The commands of "Your own model / dataset" (docs/your-own.md), run as printed, and its two example classes."""

from __future__ import annotations

import csv
import importlib.util
import json
import logging
import os
import re
import runpy
import shlex
import sys
import warnings
from collections import Counter
from pathlib import Path

import open_clip
import pytest
import torch
import torch.nn.functional as F

from xbench import findings
from xbench.cli import QUIET_LOGGERS
from xbench.findings import display_name, finding_key, short_name

REPO = Path(__file__).resolve().parents[1]
EXAMPLES = REPO / "examples"


@pytest.fixture
def load(monkeypatch):
    """Import an example module as ``PYTHONPATH=examples`` would; what it registers in
    ``xbench.findings`` (a new finding, a dataset's vocabulary) is undone after the test."""
    tables = (findings.FINDINGS, findings.SPELLINGS, findings.DEFAULT_CLASSES, findings.DATASET_NAMES)
    before = [dict(table) for table in tables]

    def loader(module: str):
        spec = importlib.util.spec_from_file_location(module, EXAMPLES / f"{module}.py")
        loaded = importlib.util.module_from_spec(spec)
        monkeypatch.setitem(sys.modules, module, loaded)
        spec.loader.exec_module(loaded)
        return loaded

    yield loader
    for table, saved in zip(tables, before):
        table.clear()
        table.update(saved)


PAGE = REPO / "docs" / "your-own.md"


def page_commands() -> list[str]:
    """Every line of the page's ``bash`` blocks, in order: the walk-through, then the examples with
    XBench's own pieces."""
    blocks = re.findall(r"```bash\n(.*?)```", PAGE.read_text(), flags=re.S)
    return [line for block in blocks for line in block.strip().splitlines()]


def results_of(clone: Path) -> dict[tuple[str, str], dict]:
    """``metrics.json`` of every run under ``clone/results``, by (model, dataset)."""
    found = {}
    for folder in (clone / "results").iterdir():
        results = json.loads((folder / "metrics.json").read_text())
        found[results["model"], results["dataset"]] = results
    return found


def run_printed(command: str, clone: Path, monkeypatch) -> None:
    """Run one printed command line in this process, as the shell and Python would from ``clone``:
    ``NAME=value`` prefixes set the environment (``PYTHONPATH`` entries, relative to ``clone``, go
    on ``sys.path``), ``python -m MODULE ARGS`` runs the module as ``__main__`` and ``python FILE
    ARGS`` the file, with ``sys.argv`` as printed; a non-zero exit fails the test. (In-process:
    a process start per command cost more than the commands.)"""
    words = shlex.split(command)
    with monkeypatch.context() as scope:
        while "=" in words[0]:
            name, _, value = words.pop(0).partition("=")
            scope.setenv(name, value)
            if name == "PYTHONPATH":
                for entry in reversed(value.split(os.pathsep)):
                    scope.syspath_prepend(str(clone / entry))
        assert words[0] == "python", f"the page prints a command this test cannot run: {command}"
        module = words[2] if words[1] == "-m" else None
        argv = words[3:] if module else words[1:]
        scope.setattr(sys, "argv", [module or argv[0], *(argv if module else argv[1:])])
        levels = {name: logging.getLogger(name).level for name in QUIET_LOGGERS}
        try:
            with warnings.catch_warnings():
                # the test process imported xbench.test already; python -m in a fresh process would not have
                warnings.filterwarnings("ignore", message=".*found in sys.modules", category=RuntimeWarning)
                if module:
                    runpy.run_module(module, run_name="__main__", alter_sys=True)
                else:
                    runpy.run_path(argv[0], run_name="__main__")
        except SystemExit as exit:
            assert exit.code in (0, None), f"{command}: exit status {exit.code}"
        finally:
            for name, level in levels.items():
                logging.getLogger(name).setLevel(level)


def test_page_commands_run_as_printed(tmp_path, monkeypatch, capsys, load, request):
    """Each command of the page, in a folder that looks like a fresh clone's root (its own
    ``results/``), with ``/tmp/`` moved into the test's folder. The example modules the runs import
    by name, and what they register, are gone after the test (``load``)."""
    clone = tmp_path / "clone"
    clone.mkdir()
    for name in ("examples", "lightning_configs"):
        (clone / name).symlink_to(REPO / name)
    monkeypatch.chdir(clone)
    monkeypatch.setenv("XBENCH_CACHE", str(tmp_path / "cache"))
    for module in ("open_clip_model", "png_folder"):
        assert module not in sys.modules
        request.addfinalizer(lambda module=module: sys.modules.pop(module, None))
    commands = page_commands()
    assert len(commands) == 6, commands
    printed = {}
    for command in commands:
        run_printed(command.replace("/tmp/", f"{tmp_path}/"), clone, monkeypatch)
        printed[command] = capsys.readouterr().out
    report = (clone / "report" / "report.md").read_text()  # the page's last command, on every run above
    assert "LOPA = Large Opacity" in report and "My PNG folder" in report
    runs = results_of(clone)
    assert set(runs) == {("patch_text_clip", "png_folder"), ("centre_prior", "png_folder"),
                         ("patch_text_clip", "phantom")}
    results = runs["patch_text_clip", "png_folder"]
    assert results["classes"] == ["nodule", "mass", "large_opacity"]
    with (tmp_path / "my_xrays" / "boxes.csv").open() as file:
        images_per_label = Counter({(row["image"], row["finding"]) for row in csv.DictReader(file)})
    for label, key in (("Nodule", "nodule"), ("Mass", "mass"), ("Large opacity", "large_opacity")):
        graded = sum(1 for image, found in images_per_label if found == label)
        for model in ("patch_text_clip", "centre_prior"):
            assert runs[model, "png_folder"]["grounding"]["per_class"][key]["pairs"] == graded > 0
        assert results["classification"]["per_class"][key]["positives"] == graded
    assert "Large Opacity" in printed[commands[2]]
    assert runs["patch_text_clip", "phantom"]["classes"] == ["nodule", "mass", "consolidation"]


def test_model_without_weights_names_the_option(load, tmp_path):
    """The example's YAML names a weights file a fresh clone does not have: the error says which
    option to give (the bare file-not-found did not)."""
    example = load("open_clip_model")
    with pytest.raises(FileNotFoundError, match="--model.weights") as error:
        example.PatchTextCLIP(arch=str(EXAMPLES / "tiny_vit.json"), weights=str(tmp_path / "missing.safetensors"))
    assert "--random-weights" in str(error.value)


@pytest.fixture
def png_folder(load):
    return load("png_folder")


def test_dataset_registers_its_new_finding_from_outside(png_folder):
    """Registered when the class is defined (and undone after this test, see ``load``)."""
    assert (display_name("large_opacity"), short_name("large_opacity")) == ("Large Opacity", "LOPA")
    assert finding_key("png_folder", "Large opacity") == "large_opacity"
    assert png_folder.PngFolder.default_classes() == ("nodule", "mass", "large_opacity")


def test_dataset_reads_boxes_and_negatives(png_folder, tmp_path):
    png_folder.write_demo(tmp_path)
    samples = png_folder.PngFolder(root=str(tmp_path)).samples
    assert [s.image_id for s in samples] == sorted(p.name for p in (tmp_path / "images").glob("*.png"))
    with (tmp_path / "boxes.csv").open() as file:
        rows = list(csv.DictReader(file))
    by_image = {s.image_id: s for s in samples}
    for row in rows:
        key = finding_key("png_folder", row["finding"])
        box = tuple(float(row[c]) for c in ("x1", "y1", "x2", "y2"))
        assert box in by_image[row["image"]].regions[key].xyxy
        assert by_image[row["image"]].labels[key] == 1
    negatives = [s for s in samples if s.image_id not in {row["image"] for row in rows}]
    assert negatives and all(not s.regions and not any(s.labels.values()) for s in negatives)


@pytest.mark.parametrize(
    ("row", "message"),
    [
        ("99999.png,Nodule,1,1,5,5", "image '99999.png' is not in"),
        ("00001.png,Nodule,1,1,abc,5", "must be numbers"),
        ("00001.png,Nodule,5,1,5,5", "x2 > x1"),
        ("00001.png,Pneumothorax,1,1,5,5", "Pneumothorax"),
    ],
)
def test_dataset_bad_row_names_file_and_line(png_folder, tmp_path, row, message):
    png_folder.write_demo(tmp_path)
    table = tmp_path / "boxes.csv"
    lines = table.read_text().splitlines()
    table.write_text("\n".join([*lines, row]) + "\n")
    with pytest.raises((ValueError, FileNotFoundError, KeyError), match=re.escape(message)) as error:
        png_folder.PngFolder(root=str(tmp_path)).samples
    assert f"line {len(lines) + 1}" in str(error.value)


def test_model_scores_as_open_clip_itself(tmp_path, load):
    """The example's logits and maps against open_clip's own encoders on the same weights."""
    example = load("open_clip_model")
    weights = tmp_path / "tiny.safetensors"
    example.write_random_weights(weights)
    model = example.PatchTextCLIP(arch=str(EXAMPLES / "tiny_vit.json"), weights=str(weights))
    model.build(["nodule", "large_opacity"])
    x = torch.randn(2, 3, 64, 64)
    logits, maps = model(x)

    reference, _ = example.build_open_clip(str(EXAMPLES / "tiny_vit.json"))
    reference.load_state_dict(model.clip.state_dict())
    reference.visual.output_tokens = False
    with torch.no_grad():
        image = F.normalize(reference.encode_image(x), dim=-1)
        text = {t: F.normalize(reference.encode_text(open_clip.tokenize([t], context_length=32)), dim=-1)[0]
                for t in ("nodule", "no nodule", "large opacity", "no large opacity")}
    expected = reference.logit_scale.exp() * torch.stack(
        [image @ text["nodule"] - image @ text["no nodule"], image @ text["large opacity"] - image @ text["no large opacity"]], 1
    )
    torch.testing.assert_close(logits, expected, rtol=1e-5, atol=1e-5)

    reference.visual.output_tokens = True
    with torch.no_grad():
        _, tokens = reference.visual(x)  # [B, 64, width], patches in raster order
    patches = F.normalize(tokens @ reference.visual.proj, dim=-1)
    for c, prompt in enumerate(("nodule", "large opacity")):
        torch.testing.assert_close(maps[:, c], (patches @ text[prompt]).reshape(2, 8, 8), rtol=1e-5, atol=1e-5)

    # a report phrase is grounded as written: its map is the patches' cosine with the phrase
    phrase = "large opacity in the left lower lobe"
    with torch.no_grad():
        phrase_text = F.normalize(reference.encode_text(open_clip.tokenize([phrase], context_length=32)), dim=-1)[0]
    grounded = model.phrase_maps(x, model.encode_phrases(["nodule", phrase]))
    torch.testing.assert_close(grounded[:, 1], (patches @ phrase_text).reshape(2, 8, 8), rtol=1e-5, atol=1e-5)
    torch.testing.assert_close(grounded[:, 0], maps[:, 0], rtol=1e-5, atol=1e-5)



def _test(model, datamodule, results: Path) -> None:
    """One run as a script makes it (docs/running.md, From a script), its folder under ``results``."""
    import lightning as L

    from xbench.reporting.writer import ResultsWriter

    trainer = L.Trainer(accelerator="cpu", devices=1, use_distributed_sampler=False, logger=False,
                        enable_progress_bar=False, enable_model_summary=False,
                        callbacks=[ResultsWriter(folder=str(results))])
    trainer.test(model, datamodule=datamodule, verbose=False)


@pytest.mark.slow
def test_the_report_names_every_example_in_a_fresh_process(tmp_path, load, phantom_root):
    """A results folder stands alone: ``python -m xbench.report`` in a process that imports none of
    the user's modules (neither ``examples/`` nor this test module is on its path) renders the
    examples' runs and those of a model and a dataset defined here, each by the names its run
    wrote -- a finding's display and short name, the model's name, the dataset's display name."""
    import subprocess

    from xbench.data.phantom import Phantom
    from xbench.findings import Finding
    from xbench.models.base import XBenchModel

    class BrightSpot(XBenchModel):  # no display_name: shown by its name
        name = "bright_spot"

        def forward(self, image):
            return torch.zeros(image.shape[0], len(self.classes)), image.expand(-1, len(self.classes), -1, -1)

    class MyBlobs(Phantom):
        name = "my_blobs"
        display_name = "My blobs"
        findings = (Finding("round_blob", "Round blob", "RBL"),)
        spellings = {"Nodule": "round_blob", "Mass": "mass", "Consolidation": "consolidation"}

        @classmethod
        def default_classes(cls) -> tuple[str, ...]:
            return tuple(cls.spellings.values())

    results = tmp_path / "results"
    png_folder, clip = load("png_folder"), load("open_clip_model")
    png_folder.write_demo(tmp_path / "my_xrays")
    clip.write_random_weights(tmp_path / "tiny.safetensors")
    _test(clip.PatchTextCLIP(arch=str(EXAMPLES / "tiny_vit.json"), weights=str(tmp_path / "tiny.safetensors")),
          png_folder.PngFolder(root=str(tmp_path / "my_xrays"), num_workers=0), results)
    _test(BrightSpot(), MyBlobs(root=str(phantom_root), num_images=9, native_size=96, num_workers=0), results)
    saved = load("precomputed_phantom").saved_and_live(tmp_path / "saved", image_size=64)
    assert {run["model"] for run in saved.values()} >= {"centre_prior", "oracle"}
    out = tmp_path / "report"
    environment = {**os.environ, "PYTHONPATH": str(REPO)}
    done = subprocess.run([sys.executable, "-m", "xbench.report", str(results), str(tmp_path / "saved" / "runs"),
                           "--out", str(out), "--replicates", "10"],
                          cwd=tmp_path, env=environment, capture_output=True, text=True, timeout=600)
    assert done.returncode == 0, done.stderr
    report = (out / "report.md").read_text()
    for shown in ("My PNG folder", "LOPA = Large Opacity", "patch_text_clip", "My blobs", "RBL = Round blob",
                  "bright_spot", "centre_prior", "oracle (ceiling)"):
        assert shown in report, shown
    for hidden in ("BrightSpot", "PatchTextCLIP", "CentrePrior", "png_folder<br>", "large_opacity"):
        assert hidden not in report, hidden
    with (out / "tables" / "pointing_game_my_blobs.csv").open() as file:
        header, *rows = list(csv.reader(file))
    assert [column for column in header if not column.endswith((" low", " high"))] == \
        ["Model", "RBL", "MASS", "CONS", "Mean"]
    assert [row[0] for row in rows] == ["bright_spot"]
    with (out / "tables" / "grounding.csv").open() as file:
        header, *rows = list(csv.reader(file))
    assert any(column.startswith("My PNG folder ") for column in header)
    assert any(column.startswith("My blobs ") for column in header)
    assert {"patch_text_clip", "bright_spot"} <= {row[0] for row in rows}
