"""The decoded-image cache: hits, misses, invalidation, atomic writes, identical results."""

import json
import os
from pathlib import Path

import pytest
import torch

import xbench.data.cache as cache_module
from conftest import run_args, write_chestx_det10
from xbench.data.cache import CachedDataset
from xbench.data.chestx_det10 import ChestXDet10
from xbench.test import main

ENTRIES = [
    {"file_name": "1.png", "syms": ["Mass", "Nodule"], "boxes": [[3, 4, 20, 30], [40, 41, 42, 43]]},
    {"file_name": "2.png", "syms": [], "boxes": []},
    {"file_name": "3.png", "syms": ["Effusion"], "boxes": [[0, 30, 64, 64]]},
]


@pytest.fixture
def root(tmp_path, monkeypatch):
    monkeypatch.setenv("XBENCH_CACHE", str(tmp_path / "cache"))
    return write_chestx_det10(tmp_path / "data", ENTRIES, size=64)


def module(root, **kwargs):
    return ChestXDet10(root=str(root), image_size=kwargs.pop("image_size", 48), num_workers=0, **kwargs)


def test_cached_samples_equal_decoded_samples(root):
    dm = module(root, augment=[{"class_path": "albumentations.Rotate", "init_args": {"limit": 10, "p": 1.0}}])
    dm.prepare_data()
    dm.setup()
    assert isinstance(dm.test_set, CachedDataset)
    decoded = dm.decoding_dataset()
    for i in range(len(ENTRIES)):
        cached, fresh = dm.test_set[i], decoded[i]
        assert cached.keys() == fresh.keys()
        for key, value in fresh.items():
            if isinstance(value, torch.Tensor):
                assert torch.equal(cached[key], value), key
            else:
                assert cached[key] == value, key


def test_hit_reuses_and_changes_invalidate(root, monkeypatch):
    first = module(root)
    first.prepare_data()
    folder = first.cache_folder()
    assert folder.is_dir()

    def no_rebuild(*args, **kwargs):
        raise AssertionError("the cache was rebuilt although nothing changed")

    monkeypatch.setattr("xbench.data.base.build_cache", no_rebuild)
    again = module(root)
    again.prepare_data()
    assert again.cache_folder() == folder
    assert module(root, image_size=32).cache_folder() != folder
    assert module(root, mask_threshold=0.25).cache_folder() != folder
    assert module(root, classes=["mass"]).cache_folder() != folder
    edited = [dict(entry) for entry in ENTRIES]
    edited[0]["boxes"] = [[3, 4, 21, 30], [40, 41, 42, 43]]
    (root / "test.json").write_text(json.dumps(edited))
    assert module(root).cache_folder() != folder
    (root / "test.json").write_text(json.dumps(ENTRIES))
    assert module(root).cache_folder() == folder
    image = root / "test_data" / "2.png"
    os.utime(image, ns=(image.stat().st_atime_ns, image.stat().st_mtime_ns + 10**9))
    assert module(root).cache_folder() != folder


def test_interrupted_write_leaves_no_usable_cache(root, monkeypatch):
    dm = module(root)
    original = cache_module.np.savez

    def crash(*args, **kwargs):
        raise KeyboardInterrupt

    monkeypatch.setattr(cache_module.np, "savez", crash)
    with pytest.raises(KeyboardInterrupt):
        dm.prepare_data()
    assert not dm.cache_folder().exists()
    assert list(dm.cache_folder().parent.iterdir()) == [], "the staging folder was left behind"
    dm.setup()
    assert not isinstance(dm.test_set, CachedDataset), "a missing cache falls back to decoding"
    monkeypatch.setattr(cache_module.np, "savez", original)
    dm.prepare_data()
    dm.setup()
    assert isinstance(dm.test_set, CachedDataset)


def test_cache_off_writes_nothing(root):
    dm = module(root, cache=False)
    dm.prepare_data()
    dm.setup()
    assert not isinstance(dm.test_set, CachedDataset)
    assert not (Path(os.environ["XBENCH_CACHE"]) / "decoded").exists()


def test_run_results_identical_with_and_without_cache(root, tmp_path):
    def run(*extra):
        return main(run_args("random", "chestx_det10", root, tmp_path / "results", *extra, image_size=48))

    without = run("--data.cache", "false")
    writing, reading = run(), run()
    for results in (writing, reading):
        for section in ("grounding", "classification", "data"):
            assert results[section] == without[section], section
