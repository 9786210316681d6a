"""The installed package carries what a run needs (issue 23.13): built as a wheel (no editable
install, no checkout beside it), it holds the key manifests, and a run's trainer defaults (the
W&B logger, float32) come from the package itself, not from a file of the checkout."""

from __future__ import annotations

import shutil
import subprocess
import sys
import zipfile
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parents[1]

pytestmark = pytest.mark.slow  # pip builds the wheel; a fresh interpreter without the checkout runs it


def test_the_wheel_holds_the_manifests_and_no_checkout_files(tmp_path):
    # built from a copy of what the wheel is made of: setuptools writes build/ beside the sources
    source = tmp_path / "source"
    shutil.copytree(REPO / "xbench", source / "xbench", ignore=shutil.ignore_patterns("__pycache__"))
    for name in ("pyproject.toml", "README.md"):
        shutil.copy(REPO / name, source / name)
    subprocess.run([sys.executable, "-m", "pip", "wheel", "--no-deps", "--no-build-isolation", "-q", "-w",
                    str(tmp_path), str(source)], check=True, capture_output=True, cwd=tmp_path)
    (wheel,) = tmp_path.glob("xbench-*.whl")
    names = set(zipfile.ZipFile(wheel).namelist())
    manifests = {p.name for p in (REPO / "xbench" / "models" / "manifests").glob("*.json")}
    assert manifests and {f"xbench/models/manifests/{name}" for name in manifests} <= names
    assert "xbench/test.py" in names and "xbench/cli.py" in names
    assert {"xbench/reporting/paper/tables.csv", "xbench/reporting/paper/paper.yaml"} <= names
    assert not any(name.startswith(("tests/", "tools/", "bench/")) for name in names)


def test_trainer_defaults_come_from_the_package(tmp_path):
    """From a folder with no lightning_configs/ in reach, --help parses and names the W&B logger."""
    result = subprocess.run([sys.executable, "-m", "xbench.test", "--print_config"], capture_output=True, text=True,
                            cwd=tmp_path, env={"PATH": "", "PYTHONPATH": str(REPO), "HOME": str(tmp_path)})
    assert "xbench.reporting.wandb.XBenchWandbLogger" in result.stdout and "precision: 32-true" in result.stdout, (
        result.stdout[-2000:] + result.stderr[-2000:])
