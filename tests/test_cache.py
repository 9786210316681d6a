"""The decoded-image cache: hits, misses, invalidation, atomic writes, damage, identical results.

(Bit-for-bit identity of every model's input with and without the cache: test_cache_exact.py.)"""

import inspect
import json
import os
from pathlib import Path

import numpy as np
import pytest
import torch

import xbench.data.cache as cache_module
from conftest import run_args, write_chestx_det10
from xbench.cli import error_line
from xbench.data import base, io, transforms
from xbench.data.cache import CacheDamagedError, CachedDataset
from xbench.data.chestx_det10 import ChestXDet10
from xbench.data.io import read_coded, read_image
from xbench.geometry.image import CodedImage
from xbench.geometry.preprocess import Preprocess
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
    return ChestXDet10(root=str(root), **{"image_size": 48, "num_workers": 0, **kwargs})


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
        np.testing.assert_array_equal(cached_native, fresh_native, "a rotated image is kept as float32, exactly")
        original = read_image(root / "test_data" / ENTRIES[i]["file_name"])
        assert not np.array_equal(cached_native, original), "the native image is the augmented one"


def test_native_image_cached_as_its_codes_and_levels(root):
    dm = module(root)
    dm.prepare_data()
    dm.setup()
    cached = dm.test_set.item(0, True)[1]
    decoded = read_coded(root / "test_data" / "1.png")
    assert isinstance(cached, CodedImage) and cached.codes.dtype == np.uint8
    np.testing.assert_array_equal(cached.codes, decoded.codes)
    np.testing.assert_array_equal(cached.levels, decoded.levels)
    assert dm.cache_folder().joinpath("natives.bin").stat().st_size >= 64 * 64 * len(ENTRIES), "native size, uncapped"


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
    decoding = [base.read_coded, io.CodedImage, io.read_dicom, base.resize_image, base.resize_mask,
                base.augment_sample, base.quantise, cache_module.to_levels]
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


def damage_truncate(path: Path) -> None:
    path.write_bytes(path.read_bytes()[:-100])


def damage_empty(path: Path) -> None:
    path.write_bytes(b"")


def damage_zero(path: Path) -> None:
    path.write_bytes(bytes(path.stat().st_size))


def damage_flip(path: Path) -> None:
    """One byte of the data changed, the size kept (past a .npy header)."""
    data = bytearray(path.read_bytes())
    data[-7] ^= 0xFF
    path.write_bytes(bytes(data))


@pytest.mark.parametrize(("name", "damage"), [
    ("natives.bin", damage_truncate), ("frames.npy", damage_empty), ("masks.npy", damage_zero),
    ("masks.npy", damage_truncate), ("index.npz", damage_flip), ("index.npz", damage_zero),
    ("manifest.json", damage_empty), ("natives.bin", "delete"),
])
def test_damaged_folder_is_rebuilt_with_a_warning(root, capsys, name, damage):
    """Damage that shows without reading pixels (a size, a header, the index, the manifest): the
    next run warns, naming the folder and what differs, and writes the cache again, saying so."""
    dm = module(root)
    dm.prepare_data()
    dm.setup()
    expected = [dm.test_set.item(i, True) for i in range(len(ENTRIES))]
    folder = dm.cache_folder()
    target = folder / name
    target.unlink() if damage == "delete" else damage(target)
    with pytest.raises(CacheDamagedError, match=f"{folder}.*{name}.*Delete the folder"):
        module(root).setup()  # read without prepare_data: an error naming the folder and the fix
    again = module(root)
    capsys.readouterr()
    with pytest.warns(UserWarning, match=f"decoded-image cache {folder} is damaged: .*{name}.*rebuilding"):
        again.prepare_data()
    assert f"Decoded-image cache rebuilt: {folder}" in capsys.readouterr().err
    again.setup()
    for i, (record, native) in enumerate(expected):
        rebuilt, rebuilt_native = again.test_set.item(i, True)
        assert all(torch.equal(rebuilt[key], record[key]) for key in ("image", "masks", "has_mask"))
        np.testing.assert_array_equal(rebuilt_native.codes, native.codes)


@pytest.mark.parametrize(("name", "what"), [("masks.npy", "frame or masks"), ("frames.npy", "frame or masks"),
                                            ("natives.bin", "native image")])
@pytest.mark.parametrize("workers", [0, 2])
def test_changed_content_of_the_same_size_is_an_error_naming_the_folder(root, name, what, workers):
    """Data changed in place (a masks.npy whose rows were zeroed would read as "no regions"): the
    read fails, naming the folder, the image and the fix, instead of giving other numbers."""
    dm = module(root, num_workers=workers)
    dm.prepare_data()
    folder = dm.cache_folder()
    path = folder / name
    header = 128 if name.endswith(".npy") else 0  # numpy's .npy header: 128 bytes here
    data = bytearray(path.read_bytes())
    data[header:] = bytes(len(data) - header)
    path.write_bytes(bytes(data))
    dm.prepare_data()  # sizes and headers agree: nothing to rebuild
    dm.setup()
    dm.set_model_transform(Preprocess(16))
    with pytest.raises(CacheDamagedError, match=rf"{folder} is damaged: the {what} of .*1\.png.*Delete the folder") as caught:
        list(dm.test_dataloader())
    line = error_line("xbench-test", caught.value)  # what the command prints: one line, no worker traceback
    assert line.startswith(f"xbench-test: error: the decoded-image cache {folder} is damaged") and "Traceback" not in line


def _rebind_index(folder: Path, binding: bytes | None) -> None:
    """Write ``binding`` (JSON bytes; ``None``: none) into the folder's index alone, and the index's
    new size and hash into the manifest: an index the manifest vouches for, bound to something else."""
    with np.load(folder / "index.npz") as index:
        arrays = {name: index[name] for name in index.files if name != "binding"}
    if binding is not None:
        arrays["binding"] = np.frombuffer(binding, dtype=np.uint8)
    np.savez(folder / "index.npz", **arrays)
    manifest = json.loads((folder / "manifest.json").read_text())
    manifest["files"]["index.npz"].update(bytes=(folder / "index.npz").stat().st_size,
                                          xxh3=cache_module._file_digest(folder / "index.npz"))
    (folder / "manifest.json").write_text(json.dumps(manifest))


@pytest.mark.parametrize(("change", "named"), [
    ({"fingerprint": "0" * 20}, "fingerprint: '{fingerprint}' expected, '00000000000000000000' found"),
    ({"dataset": "vindr"}, "dataset: 'chestx_det10' expected, 'vindr' found"),
    ({"split": "split=train"}, "split: 'split=test' expected, 'split=train' found"),
    ({"image_ids": ["1.png", "3.png", "2.png"]},
     "the 3 expected in another order (sample 1: '2.png' expected, '3.png' found)"),
    ({"image_ids": ["1.png", "2.png"]}, "2 found, 3 expected; 1 expected ones absent ['3.png']"),
    ({"image_ids": ["1.png", "2.png", "2.png"]}, "1 expected ones absent ['3.png'], 1 found ones not expected ['2.png']"),
])
@pytest.mark.parametrize("where", ["manifest.json", "index.npz"])
def test_an_entry_is_bound_to_its_fingerprint_dataset_split_and_samples(root, change, named, where):
    """Issue 41: an entry's folder copied under another entry's name was read without a word. The
    manifest and the hashed index each state the entry's binding, checked field by field."""
    dm = module(root)
    dm.prepare_data()
    folder, binding = dm.cache_folder(), dm.cache_binding()
    assert folder.name == f"chestx_det10-{binding.fingerprint}"
    assert (binding.dataset, binding.split, binding.image_ids) == ("chestx_det10", "split=test", ["1.png", "2.png", "3.png"])
    assert json.loads((folder / "manifest.json").read_text())["binding"] == binding.model_dump()
    with np.load(folder / "index.npz") as index:
        assert cache_module.Binding.model_validate_json(index["binding"].tobytes()) == binding
    foreign = binding.model_copy(update=change)
    if where == "manifest.json":
        manifest = json.loads((folder / "manifest.json").read_text())
        (folder / "manifest.json").write_text(json.dumps({**manifest, "binding": foreign.model_dump()}))
    else:
        _rebind_index(folder, foreign.model_dump_json().encode())
    with pytest.raises(CacheDamagedError, match=rf"{folder} is damaged: its {where} was written for another entry") as caught:
        module(root).setup()
    assert named.format(fingerprint=binding.fingerprint) in str(caught.value) and "Delete the folder" in str(caught.value)


def test_the_split_names_the_entry(root):
    """The dataset's own options (its split) are bound and fingerprinted: two splits that list the
    same images get two entries, rather than one that each run finds bound to the other."""

    class Tagged(ChestXDet10):
        def __init__(self, root: str, tag: str = "a", **kwargs) -> None:
            super().__init__(root=root, **kwargs)

    first, second = Tagged(str(root), tag="a", image_size=48), Tagged(str(root), tag="b", image_size=48)
    assert first.cache_binding().split == "split=test, tag=a"
    assert first.cache_folder() != second.cache_folder()
    assert first.cache_binding().image_ids == second.cache_binding().image_ids


@pytest.mark.parametrize(("binding", "named"), [
    (None, "its index.npz holds no readable binding ('binding is not a file in the archive')"),
    (b'{"fingerprint": "', "its index.npz holds no readable binding (Invalid JSON: EOF while parsing a string"),
    (b'{"fingerprint": 5}', "its index.npz holds no readable binding (fingerprint: Input should be a valid string)"),
])
def test_an_index_without_a_readable_binding_is_named(root, binding, named):
    dm = module(root)
    dm.prepare_data()
    _rebind_index(dm.cache_folder(), binding)
    with pytest.raises(CacheDamagedError, match=rf"{dm.cache_folder()} is damaged: ") as caught:
        module(root).setup()
    assert named in str(caught.value) and "\n" not in str(caught.value), str(caught.value)
