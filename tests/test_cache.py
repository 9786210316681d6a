"""The decoded-image cache: hits, misses, invalidation, atomic writes, identical results."""

import inspect
import json
import os
from pathlib import Path

import numpy as np
import pytest
import torch

import xbench.data.cache as cache_module
from conftest import run_args, write_chestx_det10
from xbench.data import base, transforms
from xbench.data.cache import CachedDataset
from xbench.data.chestx_det10 import ChestXDet10
from xbench.data.io import read_image
from xbench.data.transforms import cap_shorter_side
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
        (cached, cached_native), (fresh, fresh_native) = dm.test_set.item(i, True), decoded.item(i, True)
        assert cached.keys() == fresh.keys()
        for key, value in fresh.items():
            if isinstance(value, torch.Tensor):
                assert torch.equal(cached[key], value), key
            else:
                assert cached[key] == value, key
        assert cached_native.dtype == np.float32 and cached_native.shape == (64, 64)
        # a rotated image is no longer on the 8-bit grid: the cache holds it to half a 16-bit level
        np.testing.assert_allclose(cached_native, fresh_native, rtol=0, atol=0.5 / 65535)
        original = read_image(root / "test_data" / ENTRIES[i]["file_name"])
        assert not np.array_equal(cached_native, original), "the native image is the augmented one"


def test_native_image_capped_and_exact_within_the_cap(root):
    within = module(root)
    within.prepare_data()
    within.setup()
    native = within.test_set.item(0, True)[1]
    np.testing.assert_array_equal(native, read_image(root / "test_data" / "1.png"), "an 8-bit PNG is cached exactly")
    capped = module(root, cache_shorter_side=40)
    capped.prepare_data()
    capped.setup()
    expected = cap_shorter_side(read_image(root / "test_data" / "1.png"), 40)
    assert expected.shape == (40, 40)
    np.testing.assert_allclose(capped.test_set.item(0, True)[1], expected, atol=0.5 / 65535)
    uncached = module(root, cache=False, cache_shorter_side=40)
    uncached.setup()
    assert uncached.test_set.item(0, True)[1].shape == (64, 64), "without the cache the native file is read whole"


def test_cap_keeps_the_aspect_and_rounds_the_longer_side():
    image = np.random.default_rng(0).random((2320, 2828), dtype=np.float32)
    assert cap_shorter_side(image, 1024).shape == (1024, 1248)
    assert cap_shorter_side(image, 4000) is image


def test_masks_stored_only_for_classes_with_a_region(root):
    dm = module(root)
    assert len(dm.classes) > 3
    dm.prepare_data()
    stored = np.load(dm.cache_folder() / "masks.npy", mmap_mode="r")
    assert stored.shape[0] == 3, "1.png has mass and nodule, 2.png nothing, 3.png effusion"
    dm.setup()
    for i, entry in enumerate(ENTRIES):
        masks = dm.test_set[i]["masks"]
        assert masks.shape == (len(dm.classes), 48, 48)
        assert masks.any(dim=(1, 2)).sum() == len(set(entry["syms"]))


def test_pixel_code_is_in_the_fingerprint(root, monkeypatch):
    """A change to the code that decides the cached pixels names a new folder (issue: a changed
    mask-resize rule used to read the old cache)."""
    folder = module(root).cache_folder()
    source = inspect.getsource

    def edited(item):
        return source(item) + ("\n# changed" if item is transforms else "")

    monkeypatch.setattr(cache_module.inspect, "getsource", edited)
    assert module(root).cache_folder() != folder
    decoding = [base.read_image, base.resize_image, base.resize_mask, base.augment_sample, base.quantise,
                cache_module.cap_shorter_side, cache_module.to_levels]
    covered = {item.__name__ for item in base.PIXEL_CODE}
    assert {function.__module__ for function in decoding} <= covered
    assert base.XBenchDataset in base.PIXEL_CODE


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
    assert module(root, cache_shorter_side=512).cache_folder() != folder
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
