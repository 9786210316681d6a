"""The decoded-image cache: a split's decoded images and masks, written once, read by every model.

Decoding sets the pace of a benchmark (a 12-bit JPEG 2000 DICOM takes about a second; a ViT
forward about a millisecond on a GPU), and the paper's seven models read the same radiographs.
The cache keeps what is model-independent, so all models share one decode: the native image
losslessly, the metric-frame image (16-bit) and the masks in the frame, bit-packed and only for
the classes that have a region on the image (and a phrase dataset's query masks, every slot). The
first run writes, per split and setting, memory-mapped files and an index; later runs of any model
read them, and each model's own transform runs on the native image read back.

The native image is kept as it is decoded (`CodedImage`): its integer codes
at native resolution and the float32 grey level of each code. Without the cache the image is the
same look-up of the same codes and levels, so a model's input is identical bit for bit with and
without the cache. An augmented image has no such codes: it is kept as float32, also exact. The
frame image is put on the 16-bit grid (an error below 1e-5) whether or not the cache is used.

The folder's name carries a fingerprint of everything the content depends on: the parsed
annotations of every sample, each image (and mask) file's size and modification time, the dataset
and its own options, the class list, ``image_size``, the mask threshold, the augmentation and its
seed, the cache format, the package version and the source of the code that decides the pixels
(`code_digest`). A changed file, setting or decoding rule therefore names a different
folder. A cache is written into a temporary folder and renamed into place when complete, so a
half-written cache is never read.

An entry is bound to what it holds ([`Binding`][xbench.data.cache.Binding]: the fingerprint its
folder is named by, the dataset, the split and the image ids of its samples in order), stated in
``manifest.json`` and in the hashed index: a folder copied or renamed onto another entry's name
holds another binding.

What was written is checked on read: ``manifest.json`` states the format, the binding, each file's
size, the arrays' headers and the index's hash (checked when the folder is opened, against the
binding the datamodule expects: [`check_folder`][xbench.data.cache.check_folder]), and the index
holds an xxHash (XXH3-64) of each sample's frame and mask rows and of its native image, checked
against the bytes each read returns (1.4 ms for a VinDr-size image, ``bench/loading.py``).

The rule: what the open check finds (a damaged or foreign entry, or one of another format)
``prepare_data`` rebuilds, with a warning that names the folder and what disagrees; a reader never
rebuilds, so the same finding there, or a sample whose bytes differ, is an error that names the
folder and the fix.
"""

from __future__ import annotations

import dataclasses
import hashlib
import inspect
import json
import os
import shutil
import zipfile
from collections import Counter
from collections.abc import Sequence
from pathlib import Path
from typing import Literal

import numpy as np
import torch
import xxhash
from pydantic import BaseModel, ConfigDict, ValidationError
from rich.progress import track
from torch.utils.data import DataLoader, Dataset, default_collate

from xbench import __version__
from xbench.geometry.image import CodedImage
from xbench.data.queries import query_fields
from xbench.files import NO_ROOM, SETTINGS_CAP, WriteFailed, staging_folder, within_cap

FORMAT = 5
IMAGE_LEVELS = 65535
#: How a native image is stored: its codes' dtype (with float32 levels after them), or float32 pixels.
NATIVE_KINDS = (np.dtype(np.uint8), np.dtype(np.uint16), np.dtype(np.float32))
FLOAT_KIND = 2
#: Every stored native image starts at a multiple of this many bytes (aligned views of the file).
ALIGNMENT = 64
FILES = ("frames.npy", "masks.npy", "natives.bin", "index.npz")


class CacheDamagedError(RuntimeError):
    """A cache folder does not hold what it should: its content differs from what was written, or
    it was written for another entry or in another format."""


def damaged(folder: Path, what: str) -> CacheDamagedError:
    """The error for a damaged cache folder: what differs, and the fix; ``reason`` holds ``what``."""
    error = CacheDamagedError(
        f"the decoded-image cache {folder} is damaged: {what}. Delete the folder {folder} and run again "
        "(the cache is rebuilt), or run with --data.cache false"
    )
    error.reason = what
    return error


class Binding(BaseModel):
    """What a cache entry holds, stored in its manifest and its index and checked when it is opened:
    the fingerprint its folder is named by ([`fingerprint`][xbench.data.cache.fingerprint]), the
    dataset's name, the split (the dataset's own options, e.g. ``split=test``; empty for a dataset
    without options of its own) and the image ids of its samples, in order."""

    model_config = ConfigDict(strict=True, extra="forbid", frozen=True)

    fingerprint: str
    dataset: str
    split: str
    image_ids: list[str]


class _StoredFile(BaseModel):
    model_config = ConfigDict(strict=True, extra="forbid")

    bytes: int
    header: tuple[list[int], str] | None = None
    xxh3: int | None = None


class _Manifest(BaseModel):
    """``manifest.json``: the format, the binding, and each file as written (``check_folder``)."""

    model_config = ConfigDict(strict=True, extra="forbid")

    format: Literal[FORMAT]
    binding: Binding
    files: dict[str, _StoredFile]


def quantise(image: torch.Tensor) -> torch.Tensor:
    """An image on the 16-bit grid it is cached on (float32, exact round trip)."""
    return torch.round(image * IMAGE_LEVELS) / IMAGE_LEVELS


def to_levels(image: np.ndarray) -> np.ndarray:
    """A float image in [0, 1] as its 16-bit levels (uint16)."""
    return np.round(image * np.float32(IMAGE_LEVELS)).astype(np.uint16)


def code_digest(*code) -> str:
    """A hash of the source of the modules, classes or functions ``code`` that decide the cached pixels."""
    digest = hashlib.sha256()
    for item in code:
        digest.update(inspect.getsource(item).encode())
    return digest.hexdigest()[:16]


def _region_files(region) -> list[Path]:
    if not dataclasses.is_dataclass(region):
        return []
    found = []
    for field in dataclasses.fields(region):
        value = getattr(region, field.name)
        if isinstance(value, Path):
            found.append(value)
        elif dataclasses.is_dataclass(value):
            found += _region_files(value)
    return found


def fingerprint(samples: Sequence, settings: dict) -> str:
    """A short hash of the samples (annotations and file stamps) and the settings."""
    digest = hashlib.sha256(json.dumps({**settings, "format": FORMAT, "xbench": __version__}, sort_keys=True).encode())
    for sample in samples:
        regions = sorted((key, repr(region)) for key, region in sample.regions.items())
        digest.update(repr((sample.image_id, str(sample.path), sorted(sample.labels.items()), regions,
                            sample.queries)).encode())
        drawn = [*sample.regions.values(), *(query.region for query in sample.queries)]
        for path in (sample.path, *(p for region in drawn for p in _region_files(region))):
            stat = os.stat(path)
            digest.update(f"{stat.st_size}:{stat.st_mtime_ns}".encode())
    return digest.hexdigest()[:20]


def folder_size(folder: Path) -> int:
    return sum(path.stat().st_size for path in folder.iterdir())


def mask_rows(samples: Sequence, classes: Sequence[str]) -> np.ndarray:
    """int64 [N, C]: the row of the masks file holding (sample, class), -1 where the sample has no
    region for the class (only those rows are stored)."""
    present = np.array([[key in sample.regions for key in classes] for sample in samples], dtype=bool).reshape(
        len(samples), len(classes)
    )
    rows = np.full(present.shape, -1, dtype=np.int64)
    rows[present] = np.arange(int(present.sum()))
    return rows


def _digest(*parts: np.ndarray) -> int:
    """XXH3-64 of the bytes of ``parts``, in order."""
    hasher = xxhash.xxh3_64()
    for part in parts:
        hasher.update(np.ascontiguousarray(part).data)
    return hasher.intdigest()


def _native_entry(native: CodedImage | np.ndarray) -> tuple[int, np.ndarray, int]:
    """A native image as stored: its kind (an index into `NATIVE_KINDS`), its bytes (the
    codes, padded to `ALIGNMENT`, then the float32 levels; or the float32 pixels) and the
    number of levels (0 for float pixels)."""
    if not isinstance(native, CodedImage):
        return FLOAT_KIND, np.ascontiguousarray(native, dtype=np.float32).reshape(-1).view(np.uint8), 0
    codes = np.ascontiguousarray(native.codes).reshape(-1).view(np.uint8)
    levels = np.ascontiguousarray(native.levels, dtype=np.float32).view(np.uint8)
    entry = np.zeros(_padded(codes.nbytes) + levels.nbytes, dtype=np.uint8)
    entry[: codes.nbytes], entry[_padded(codes.nbytes) :] = codes, levels
    return NATIVE_KINDS.index(native.codes.dtype), entry, len(native.levels)


def _padded(size: int) -> int:
    return -(-size // ALIGNMENT) * ALIGNMENT


class _CacheRecords(Dataset):
    """What the cache stores of each sample, decoded in a DataLoader worker: the sample dict and
    its native image (codes and levels, or float32 where augmented)."""

    def __init__(self, dataset: Dataset) -> None:
        self.dataset = dataset

    def __len__(self) -> int:
        return len(self.dataset)

    def __getitem__(self, index: int) -> tuple[dict, CodedImage | np.ndarray]:
        return self.dataset.item(index, with_native=True)


def _collate_records(records: list[tuple[dict, CodedImage | np.ndarray]]) -> tuple[dict, list]:
    samples, natives = zip(*records)
    return default_collate(list(samples)), list(natives)


def build_cache(folder: Path, binding: Binding, dataset: Dataset, image_size: int, batch_size: int,
                num_workers: int) -> None:
    """Decode every sample of ``dataset`` (an ``XBenchDataset``, in DataLoader workers) into
    ``folder``, atomically, bound to ``binding``."""
    staging = staging_folder(folder.parent, folder.name)
    try:
        count, pixels = len(dataset), image_size * image_size
        rows_of = mask_rows(dataset.samples, dataset.classes)
        frames = np.lib.format.open_memmap(staging / "frames.npy", "w+", np.uint16, (count, image_size, image_size))
        masks = np.lib.format.open_memmap(
            staging / "masks.npy", "w+", np.uint8, (int((rows_of >= 0).sum()), (pixels + 7) // 8)
        )
        has_mask = np.zeros(rows_of.shape, dtype=bool)
        lost = np.zeros(rows_of.shape, dtype=bool)
        slots = dataset.query_slots
        # a phrase dataset's query masks: few (MS-CXR has about one per image), kept in full
        query_masks = np.zeros((count, slots, (pixels + 7) // 8), dtype=np.uint8)
        query_has_mask = np.zeros((count, slots), dtype=bool)
        query_lost = np.zeros((count, slots), dtype=bool)
        clipped = np.zeros(count, dtype=np.int64)
        native_sizes = np.zeros((count, 2), dtype=np.int64)
        record_hashes = np.zeros(count, dtype=np.uint64)
        native_offsets = np.zeros(count, dtype=np.int64)
        native_shapes = np.zeros((count, 2), dtype=np.int64)
        native_kinds = np.zeros(count, dtype=np.int8)
        native_levels = np.zeros(count, dtype=np.int64)
        native_hashes = np.zeros(count, dtype=np.uint64)
        offset = 0
        loader = DataLoader(
            _CacheRecords(dataset), batch_size=batch_size, num_workers=num_workers, collate_fn=_collate_records
        )
        with open(staging / "natives.bin", "wb") as natives_file:
            for batch, natives in track(loader, description=f"Decoding {count} images into the cache"):
                rows = batch["index"].numpy()
                frames[rows] = to_levels(batch["image"][:, 0].numpy())
                stored = rows_of[rows] >= 0
                masks[rows_of[rows][stored]] = np.packbits(batch["masks"].numpy()[stored].reshape(-1, pixels), axis=-1)
                has_mask[rows] = batch["has_mask"].numpy()
                lost[rows] = batch["lost_regions"].numpy()
                clipped[rows] = batch["clipped_shapes"].numpy()
                native_sizes[rows] = batch["native_size"].numpy()
                if slots:
                    query_masks[rows] = np.packbits(batch["query_masks"].numpy().reshape(len(rows), slots, pixels), axis=-1)
                    query_has_mask[rows] = batch["query_has_mask"].numpy()
                    query_lost[rows] = batch["query_lost"].numpy()
                for row, native in zip(rows, natives):
                    record_hashes[row] = _digest(frames[row], *(masks[r] for r in rows_of[row] if r >= 0))
                    kind, entry, levels = _native_entry(native)
                    natives_file.write(np.pad(entry, (0, _padded(entry.nbytes) - entry.nbytes)).data)
                    native_offsets[row], native_shapes[row], native_kinds[row] = offset, native.shape, kind
                    native_levels[row], native_hashes[row] = levels, _digest(entry)
                    offset += _padded(entry.nbytes)
        frames.flush()
        masks.flush()
        del frames, masks
        np.savez(
            staging / "index.npz", has_mask=has_mask, lost_regions=lost, clipped_shapes=clipped, native_sizes=native_sizes,
            mask_rows=rows_of,
            native_offsets=native_offsets, native_shapes=native_shapes, native_kinds=native_kinds,
            native_levels=native_levels, native_hashes=native_hashes, record_hashes=record_hashes,
            query_masks=query_masks, query_has_mask=query_has_mask, query_lost=query_lost,
            binding=np.frombuffer(binding.model_dump_json().encode(), dtype=np.uint8),
        )
        (staging / "manifest.json").write_text(_manifest(staging, binding).model_dump_json(indent=1))
        try:
            os.rename(staging, folder)
        except OSError:  # another process finished the same cache first; theirs is identical
            shutil.rmtree(staging, ignore_errors=True)
    except BaseException as error:
        shutil.rmtree(staging, ignore_errors=True)
        if isinstance(error, OSError) and error.errno in NO_ROOM:
            raise WriteFailed(error, f"the decoded-image cache {folder}", "free space or lift the limit, set "
                              "XBENCH_CACHE to a folder with room, or run with --data.cache false") from error
        raise


def _npy_header(path: Path) -> tuple[list[int], str]:
    """A ``.npy`` file's (shape, dtype), from its header alone."""
    readers = {(1, 0): np.lib.format.read_array_header_1_0, (2, 0): np.lib.format.read_array_header_2_0}
    with open(path, "rb") as file:
        version = np.lib.format.read_magic(file)
        if version not in readers:
            raise ValueError(f"{path.name}: .npy format version {version}")
        shape, _, dtype = readers[version](file)
    return list(shape), dtype.str


def _file_digest(path: Path) -> int:
    hasher = xxhash.xxh3_64()
    with open(path, "rb") as file:
        while chunk := file.read(1 << 20):
            hasher.update(chunk)
    return hasher.intdigest()


def _manifest(folder: Path, binding: Binding) -> _Manifest:
    """What ``check_folder`` checks: the binding, each file's size, the arrays' headers, the index's hash."""
    files = {name: _StoredFile(bytes=(folder / name).stat().st_size,
                               header=_npy_header(folder / name) if name.endswith(".npy") else None,
                               xxh3=_file_digest(folder / name) if name == "index.npz" else None)
             for name in FILES}
    return _Manifest(format=FORMAT, binding=binding, files=files)


def _read_manifest(folder: Path) -> _Manifest:
    """The folder's ``manifest.json``, checked for its format and shape; else ``CacheDamagedError``."""
    try:
        text = within_cap(folder / "manifest.json", SETTINGS_CAP).read_bytes()
    except OSError as error:
        raise damaged(folder, f"its manifest.json cannot be read ({error.strerror})") from None
    except ValueError as error:  # not a regular file, or larger than any manifest
        raise damaged(folder, f"its manifest.json cannot be read ({error})") from None
    try:
        manifest = _Manifest.model_validate_json(text)
    except ValidationError as error:
        problem = error.errors()[0]
        if problem["loc"] == ("format",):
            raise damaged(folder, f"its manifest.json was written in cache format {problem['input']!r} (an older or "
                                  f"newer XBench); this one reads format {FORMAT}") from None
        raise damaged(folder, f"its manifest.json is not a cache manifest ({_first_problem(error)})") from None
    if set(manifest.files) != set(FILES):
        raise damaged(folder, f"its manifest.json lists the files {sorted(manifest.files)}, not {sorted(FILES)}")
    return manifest


def _first_problem(error: ValidationError) -> str:
    """The first thing pydantic found wrong, on one line: the field's path and what is wrong with it."""
    problem = error.errors()[0]
    field = ".".join(map(str, problem["loc"]))
    return f"{field}: {problem['msg']}" if field else problem["msg"]


def _sample_difference(expected: list[str], found: list[str]) -> str:
    """How an entry's image ids differ from the expected ones, in a few words."""
    if Counter(found) == Counter(expected):
        row = next(row for row, (want, got) in enumerate(zip(expected, found)) if want != got)
        return (f"image ids: the {len(expected)} expected in another order (sample {row}: {expected[row]!r} "
                f"expected, {found[row]!r} found)")
    missing = list((Counter(expected) - Counter(found)).elements())
    extra = list((Counter(found) - Counter(expected)).elements())
    return (f"image ids: {len(found)} found, {len(expected)} expected; {len(missing)} expected ones absent "
            f"{missing[:3]}, {len(extra)} found ones not expected {extra[:3]}")


def _check_binding(folder: Path, where: str, expected: Binding, found: Binding) -> None:
    """``found`` (read from the folder's ``where``) is ``expected``; else ``CacheDamagedError``
    saying, field by field, what was expected and what was found."""
    differences = [f"{name}: {getattr(expected, name)!r} expected, {getattr(found, name)!r} found"
                   for name in ("fingerprint", "dataset", "split") if getattr(expected, name) != getattr(found, name)]
    if expected.image_ids != found.image_ids:
        differences.append(_sample_difference(expected.image_ids, found.image_ids))
    if differences:
        raise damaged(folder, f"its {where} was written for another entry ({'; '.join(differences)})")


def check_folder(folder: Path, binding: Binding) -> None:
    """The cache folder holds what ``manifest.json`` says was written for ``binding``: the manifest's
    and the index's binding, each file at its size, the arrays' headers, the index's content (a few
    MB at most); else [`CacheDamagedError`][xbench.data.cache.CacheDamagedError] saying what
    differs. Reads no pixels."""
    written = _read_manifest(folder)
    _check_binding(folder, "manifest.json", binding, written.binding)
    for name, stated in written.files.items():
        path = folder / name
        if not path.is_file():
            raise damaged(folder, f"{name} is missing")
        if path.stat().st_size != stated.bytes:
            raise damaged(folder, f"{name} holds {path.stat().st_size} bytes, {stated.bytes} were written")
    for name, stated in written.files.items():
        if stated.header is not None:
            try:
                header = _npy_header(folder / name)
            except (OSError, ValueError) as error:
                raise damaged(folder, f"{name}'s header cannot be read ({error})") from None
            if header != stated.header:
                raise damaged(folder, f"{name}'s header says {header}, {stated.header} was written")
        if stated.xxh3 is not None and _file_digest(folder / name) != stated.xxh3:
            raise damaged(folder, f"{name}'s content differs from what was written")
    try:
        with np.load(folder / "index.npz") as index:
            indexed = Binding.model_validate_json(index["binding"].tobytes())
    except ValidationError as error:
        raise damaged(folder, f"its index.npz holds no readable binding ({_first_problem(error)})") from None
    except (OSError, ValueError, KeyError, zipfile.BadZipFile) as error:
        raise damaged(folder, f"its index.npz holds no readable binding ({error})") from None
    _check_binding(folder, "index.npz", binding, indexed)


class CachedDataset(Dataset):
    """Samples read back from a cache folder; the same dicts `XBenchDataset` yields, and
    (`item`) the cached native image."""

    def __init__(self, folder: Path, binding: Binding, samples: Sequence, classes: Sequence[str], image_size: int,
                 query_slots: int = 0, phrases: Sequence[str] = ()) -> None:
        check_folder(folder, binding)
        self.folder = folder
        self.samples = samples
        self.classes = list(classes)
        self.image_size = image_size
        self.query_slots = query_slots
        self.phrase_row = {text: row for row, text in enumerate(phrases)}
        try:
            with np.load(folder / "index.npz") as index:
                index = dict(index)
        except (OSError, ValueError, KeyError, zipfile.BadZipFile) as error:
            raise damaged(folder, f"its index.npz cannot be read ({error})") from None
        self.query_masks = index["query_masks"]
        self.query_has_mask = torch.from_numpy(index["query_has_mask"])
        self.query_lost = torch.from_numpy(index["query_lost"])
        self.has_mask = torch.from_numpy(index["has_mask"])
        self.lost_regions = torch.from_numpy(index["lost_regions"])
        self.clipped_shapes = index["clipped_shapes"]
        self.native_sizes = torch.from_numpy(index["native_sizes"])
        self.mask_rows = index["mask_rows"]
        self.record_hashes = index["record_hashes"]
        self.native_offsets = index["native_offsets"]
        self.native_shapes = index["native_shapes"]
        self.native_kinds = index["native_kinds"]
        self.native_levels = index["native_levels"]
        self.native_hashes = index["native_hashes"]
        self._frames: np.ndarray | None = None
        self._masks: np.ndarray | None = None
        self._natives: np.ndarray | None = None
        self._open()  # the arrays' headers, checked here once
        self._frames = self._masks = self._natives = None  # a memory map does not pickle to workers

    def _open(self) -> None:
        size = self.image_size
        expected = {
            "frames.npy": ((len(self.samples), size, size), np.uint16),
            "masks.npy": ((int((self.mask_rows >= 0).sum()), (size * size + 7) // 8), np.uint8),
        }
        opened = {}
        for name, (shape, dtype) in expected.items():
            try:
                opened[name] = np.load(self.folder / name, mmap_mode="r")
            except (OSError, ValueError) as error:
                raise damaged(self.folder, f"{name} cannot be opened ({error})") from None
            if opened[name].shape != shape or opened[name].dtype != dtype:
                raise damaged(self.folder, f"{name} holds {opened[name].dtype} {opened[name].shape}, not {np.dtype(dtype)} {shape}")
        self._frames, self._masks = opened["frames.npy"], opened["masks.npy"]
        self._natives = np.memmap(self.folder / "natives.bin", dtype=np.uint8, mode="r")

    def __len__(self) -> int:
        return len(self.samples)

    def __getitem__(self, index: int) -> dict:
        return self.item(index, with_native=False)[0]

    def item(self, index: int, with_native: bool) -> tuple[dict, CodedImage | np.ndarray | None]:
        """The sample dict and, if asked, the cached native image (as `item`)."""
        if self._frames is None:  # opened in each worker: a memory map does not pickle
            self._open()
        size, num_classes = self.image_size, len(self.classes)
        sample = self.samples[index]
        stored = np.flatnonzero(self.mask_rows[index] >= 0)
        frame = np.asarray(self._frames[index])
        packed = np.asarray(self._masks[self.mask_rows[index][stored]])
        if _digest(frame, *packed) != self.record_hashes[index]:
            raise damaged(self.folder, f"the frame or masks of image {sample.image_id} (sample {index}) differ from "
                                       "what was written")
        masks = torch.zeros(num_classes, size, size, dtype=torch.bool)
        if len(stored):
            unpacked = np.unpackbits(packed, axis=-1, count=size * size)
            masks[stored] = torch.from_numpy(unpacked.view(bool).reshape(len(stored), size, size))
        record = {
            "image": (torch.from_numpy(frame.astype(np.float32)) / IMAGE_LEVELS).unsqueeze(0),
            "labels": torch.tensor([float(sample.labels[key]) for key in self.classes]),
            "masks": masks,
            "has_mask": self.has_mask[index].clone(),
            "index": index,
            "image_id": sample.image_id,
            "native_size": self.native_sizes[index].clone(),
            "clipped_shapes": int(self.clipped_shapes[index]),
            "lost_regions": self.lost_regions[index].clone(),
        }
        if self.query_slots:
            unpacked = np.unpackbits(self.query_masks[index], axis=-1, count=size * size)
            queries = [q for q in sample.queries if q.finding in self.classes]
            record.update(query_fields(queries, self.classes, self.phrase_row, self.query_slots))
            record.update(query_masks=torch.from_numpy(unpacked.view(bool).reshape(self.query_slots, size, size)),
                          query_has_mask=self.query_has_mask[index].clone(), query_lost=self.query_lost[index].clone())
        return record, self.native(index) if with_native else None

    def native(self, index: int) -> CodedImage | np.ndarray:
        """The native image of sample ``index`` as decoded: codes and levels, or float32 pixels."""
        shape, kind = tuple(int(side) for side in self.native_shapes[index]), NATIVE_KINDS[self.native_kinds[index]]
        payload = shape[0] * shape[1] * kind.itemsize
        levels = int(self.native_levels[index]) * 4
        start = int(self.native_offsets[index])
        end = start + (_padded(payload) + levels if levels else payload)
        entry = self._natives[start:end]
        if _digest(entry) != self.native_hashes[index]:
            raise damaged(self.folder, f"the native image of {self.samples[index].image_id} (sample {index}) differs "
                                       "from what was written")
        if self.native_kinds[index] == FLOAT_KIND:
            return np.array(entry).view(kind).reshape(shape)  # a writable copy, as decoding gives
        return CodedImage(np.asarray(entry[:payload]).view(kind).reshape(shape),
                          np.asarray(entry[_padded(payload) :]).view(np.float32))
