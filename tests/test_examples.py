"""The README's "Your own model / dataset" walk-through, run as written, and its two example classes."""

from __future__ import annotations

import csv
import importlib.util
import json
import os
import re
import subprocess
import sys
from collections import Counter
from pathlib import Path

import open_clip
import pytest
import torch
import torch.nn.functional as F

from conftest import SUBPROCESS_SAFETY_TIMEOUT

from xbench import findings
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


def readme_commands() -> list[str]:
    section = REPO.joinpath("README.md").read_text().split("## Your own model / dataset", 1)[1].split("\n## ", 1)[0]
    (block,) = re.findall(r"```bash\n(.*?)```", section, flags=re.S)
    return block.strip().splitlines()


def test_readme_walkthrough_runs_as_written(tmp_path):
    """Each command of the README, in a folder that looks like a fresh clone's root (its own
    ``results/`` and ``wandb/``), with ``/tmp/`` moved into the test's folder."""
    clone = tmp_path / "clone"
    clone.mkdir()
    for name in ("examples", "lightning_configs"):
        (clone / name).symlink_to(REPO / name)
    env = {
        **os.environ,
        "PATH": f"{Path(sys.executable).parent}{os.pathsep}{os.environ['PATH']}",
        "XBENCH_CACHE": str(tmp_path / "cache"),
        "WANDB_MODE": "offline",
        "PYTHONPATH": "",
    }
    for command in readme_commands():
        done = subprocess.run(command.replace("/tmp/", f"{tmp_path}/"), shell=True, cwd=clone, env=env,
                              capture_output=True, text=True, timeout=SUBPROCESS_SAFETY_TIMEOUT)
        assert done.returncode == 0, f"{command}\n{done.stderr[-3000:]}"
    (folder,) = (clone / "results").iterdir()
    results = json.loads((folder / "metrics.json").read_text())
    assert (results["model"], results["dataset"]) == ("patch_text_clip", "png_folder")
    assert results["classes"] == ["nodule", "mass", "large_opacity"]
    with (tmp_path / "my_xrays" / "boxes.csv").open() as file:
        images_per_label = Counter({(row["image"], row["finding"]) for row in csv.DictReader(file)})
    for label, key in (("Nodule", "nodule"), ("Mass", "mass"), ("Large opacity", "large_opacity")):
        graded = sum(1 for image, found in images_per_label if found == label)
        assert results["grounding"]["per_class"][key]["pairs"] == graded > 0
        assert results["classification"]["per_class"][key]["positives"] == graded
    assert "Large Opacity" in done.stdout


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

