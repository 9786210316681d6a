"""Every folder and file XBench creates has the mode the user's umask gives, as ``mkdir`` and
``open`` would: ``tempfile`` makes folders 0700 and files 0600, which a group the user shares the
cache or results with cannot read. Results are held in ``test_bad_inputs.py``
(``test_results_follow_the_users_umask``); here the phantom, the decoded-image cache and the
text-embedding cache, under a umask (027) whose modes no default gives."""

from __future__ import annotations

import os
import stat
from pathlib import Path

import pytest

import xbench.models.text as text_module
from xbench.data.phantom import Phantom
from xbench.files import atomic_write, staging_folder
from xbench.models.random_weights import write_bert

UMASK = 0o027
FOLDER, FILE = 0o777 & ~UMASK, 0o666 & ~UMASK


@pytest.fixture
def umask():
    previous = os.umask(UMASK)
    yield
    os.umask(previous)


def modes(root: Path) -> dict[str, set[Path]]:
    """Every path below ``root`` whose mode is not the umask's, by kind."""
    wrong = {"folders": set(), "files": set()}
    for path in root.rglob("*"):
        expected = FOLDER if path.is_dir() else FILE
        if stat.S_IMODE(path.stat().st_mode) != expected:
            wrong["folders" if path.is_dir() else "files"].add(path.relative_to(root))
    return wrong


def test_the_phantom_and_the_decoded_image_cache_follow_the_umask(tmp_path, monkeypatch, umask):
    monkeypatch.setenv("XBENCH_CACHE", str(tmp_path / "cache"))
    data = Phantom(num_images=4, native_size=64, image_size=16, num_workers=0, cache=True)
    data.prepare_data()  # generates the phantom, then decodes it into the cache
    decoded = list((tmp_path / "cache" / "decoded").iterdir())
    phantom = [path for path in (tmp_path / "cache").iterdir() if path.name.startswith("phantom")]
    assert len(decoded) == 1 and len(phantom) == 1, sorted((tmp_path / "cache").rglob("*"))
    assert modes(tmp_path / "cache") == {"folders": set(), "files": set()}


def test_the_text_embedding_cache_follows_the_umask(tmp_path, monkeypatch, umask):
    monkeypatch.setenv("XBENCH_CACHE", str(tmp_path / "cache"))
    bert = tmp_path / "bert"
    write_bert(bert)
    text_module.bert_cls_embeddings(bert, ["The nodule finding."], "test BERT")
    (entry,) = (tmp_path / "cache" / "text_embeddings").iterdir()
    assert entry.suffix == ".safetensors"
    assert modes(tmp_path / "cache") == {"folders": set(), "files": set()}


def test_staging_folders_and_atomic_writes_follow_the_umask(tmp_path, umask):
    staging = staging_folder(tmp_path / "parent", "run")
    atomic_write(staging / "a.txt", lambda path: path.write_text("a"))
    assert staging.name.startswith(".run.")
    assert modes(tmp_path) == {"folders": set(), "files": set()}
