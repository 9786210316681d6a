"""The decoded-image cache: a split's decoded images and masks, written once, read by every model.

Decoding sets the pace of a benchmark (a 12-bit JPEG 2000 DICOM takes about a second; a ViT
forward about a millisecond on a GPU), and the paper's seven models read the same radiographs.
The cache keeps what is model-independent, so all models share one decode: the native image at its
own aspect ratio (16-bit; its shorter side capped, by default at 1024, enough for every model's
input, with the models' own transforms applied after the read), the metric-frame image (16-bit) and
the masks in the frame, bit-packed and only for the classes that have a region on the image (and a
phrase dataset's query masks, every slot). The
first run writes, per split and setting, memory-mapped files and an index; later runs of any model
read them.

The folder's name carries a fingerprint of everything the content depends on: the parsed
annotations of every sample, each image (and mask) file's size and modification time, the class
list, ``image_size``, the mask threshold, the native cap, the augmentation and its seed, the cache
format, the package version and the source of the code that decides the pixels
(:func:`code_digest`). A changed file, setting or decoding rule therefore names a different
folder. A cache is written into a temporary folder and renamed into place when complete, so a
half-written cache is never read.

The frame image is quantised to 16 bits (an error below 1e-5) whether or not the cache is used.
The native image is cached as 16-bit levels, exact for 8- and 16-bit files; without the cache the
models' transforms read it as decoded. A run therefore gives identical numbers with and without
the cache wherever the native image is 8- or 16-bit and within the cap.
"""

from __future__ import annotations

import dataclasses
import hashlib
import inspect
import json
import os
import shutil
import tempfile
from collections.abc import Sequence
from pathlib import Path

import numpy as np
import torch
from rich.progress import track
from torch.utils.data import DataLoader, Dataset, default_collate

from xbench import __version__
from xbench.data.queries import query_fields
from xbench.data.transforms import cap_shorter_side

FORMAT = 3
IMAGE_LEVELS = 65535
#: The default cap on the native image's shorter side in the cache: twice the largest model input
#: (KAD's 512), and the native size of NIH ChestX-ray14, ChestX-Det10, RSNA and SIIM, which are
#: therefore cached exactly.
NATIVE_SHORTER_SIDE = 1024


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


class _CacheRecords(Dataset):
    """What the cache stores of each sample, decoded in a DataLoader worker: the sample dict and
    its native image, capped and as 16-bit levels."""

    def __init__(self, dataset: Dataset, native_shorter_side: int) -> None:
        self.dataset = dataset
        self.native_shorter_side = native_shorter_side

    def __len__(self) -> int:
        return len(self.dataset)

    def __getitem__(self, index: int) -> tuple[dict, np.ndarray]:
        sample, native = self.dataset.item(index, with_native=True)
        return sample, to_levels(cap_shorter_side(native, self.native_shorter_side))


def _collate_records(records: list[tuple[dict, np.ndarray]]) -> tuple[dict, list[np.ndarray]]:
    samples, natives = zip(*records)
    return default_collate(list(samples)), list(natives)


def build_cache(
    folder: Path, dataset: Dataset, native_shorter_side: int, image_size: int, batch_size: int, num_workers: int
) -> None:
    """Decode every sample of ``dataset`` (an ``XBenchDataset``, in DataLoader workers) into
    ``folder``, atomically."""
    folder.parent.mkdir(parents=True, exist_ok=True)
    staging = Path(tempfile.mkdtemp(dir=folder.parent, prefix=f".{folder.name}."))
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
        native_offsets = np.zeros(count, dtype=np.int64)
        native_shapes = np.zeros((count, 2), dtype=np.int64)
        offset = 0
        loader = DataLoader(
            _CacheRecords(dataset, native_shorter_side), batch_size=batch_size, num_workers=num_workers,
            collate_fn=_collate_records,
        )
        with open(staging / "natives.u16", "wb") as natives_file:
            for batch, natives in track(loader, description=f"Decoding {count} images into the cache"):
                rows = batch["index"].numpy()
                frames[rows] = to_levels(batch["image"][:, 0].numpy())
                stored = rows_of[rows] >= 0
                masks[rows_of[rows][stored]] = np.packbits(batch["masks"].numpy()[stored].reshape(-1, pixels), axis=-1)
                has_mask[rows] = batch["has_mask"].numpy()
                lost[rows] = batch["lost_regions"].numpy()
                clipped[rows] = batch["clipped_shapes"].numpy()
                if slots:
                    query_masks[rows] = np.packbits(batch["query_masks"].numpy().reshape(len(rows), slots, pixels), axis=-1)
                    query_has_mask[rows] = batch["query_has_mask"].numpy()
                    query_lost[rows] = batch["query_lost"].numpy()
                for row, native in zip(rows, natives):
                    natives_file.write(native.tobytes())
                    native_offsets[row], native_shapes[row] = offset, native.shape
                    offset += native.size
        frames.flush()
        masks.flush()
        del frames, masks
        np.savez(
            staging / "index.npz", has_mask=has_mask, lost_regions=lost, clipped_shapes=clipped, mask_rows=rows_of,
            native_offsets=native_offsets, native_shapes=native_shapes, query_masks=query_masks,
            query_has_mask=query_has_mask, query_lost=query_lost,
        )
        try:
            os.rename(staging, folder)
        except OSError:  # another process finished the same cache first; theirs is identical
            shutil.rmtree(staging, ignore_errors=True)
    except BaseException:
        shutil.rmtree(staging, ignore_errors=True)
        raise


class CachedDataset(Dataset):
    """Samples read back from a cache folder; the same dicts :class:`XBenchDataset` yields, and
    (:meth:`item`) the cached native image."""

    def __init__(self, folder: Path, samples: Sequence, classes: Sequence[str], image_size: int,
                 query_slots: int = 0, phrases: Sequence[str] = ()) -> None:
        self.folder = folder
        self.samples = samples
        self.classes = list(classes)
        self.image_size = image_size
        self.query_slots = query_slots
        self.phrase_row = {text: row for row, text in enumerate(phrases)}
        index = np.load(folder / "index.npz")
        self.query_masks = index["query_masks"]
        self.query_has_mask = torch.from_numpy(index["query_has_mask"])
        self.query_lost = torch.from_numpy(index["query_lost"])
        self.has_mask = torch.from_numpy(index["has_mask"])
        self.lost_regions = torch.from_numpy(index["lost_regions"])
        self.clipped_shapes = index["clipped_shapes"]
        self.mask_rows = index["mask_rows"]
        self.native_offsets = index["native_offsets"]
        self.native_shapes = index["native_shapes"]
        if len(self.clipped_shapes) != len(samples):
            raise RuntimeError(f"the cache {folder} holds {len(self.clipped_shapes)} samples, the split {len(samples)}")
        self._frames: np.ndarray | None = None
        self._masks: np.ndarray | None = None
        self._natives: np.ndarray | None = None

    def __len__(self) -> int:
        return len(self.samples)

    def __getitem__(self, index: int) -> dict:
        return self.item(index, with_native=False)[0]

    def item(self, index: int, with_native: bool) -> tuple[dict, np.ndarray | None]:
        """The sample dict and, if asked, the cached native image (float32 [h, w] in [0, 1])."""
        if self._frames is None:  # opened in each worker: a memory map does not pickle
            self._frames = np.load(self.folder / "frames.npy", mmap_mode="r")
            self._masks = np.load(self.folder / "masks.npy", mmap_mode="r")
            self._natives = np.memmap(self.folder / "natives.u16", dtype=np.uint16, mode="r")
        size, num_classes = self.image_size, len(self.classes)
        image = torch.from_numpy(self._frames[index].astype(np.float32)) / IMAGE_LEVELS
        masks = torch.zeros(num_classes, size, size, dtype=torch.bool)
        stored = np.flatnonzero(self.mask_rows[index] >= 0)
        if len(stored):
            unpacked = np.unpackbits(self._masks[self.mask_rows[index][stored]], axis=-1, count=size * size)
            masks[stored] = torch.from_numpy(unpacked.view(bool).reshape(len(stored), size, size))
        sample = self.samples[index]
        record = {
            "image": image.unsqueeze(0),
            "labels": torch.tensor([float(sample.labels[key]) for key in self.classes]),
            "masks": masks,
            "has_mask": self.has_mask[index].clone(),
            "index": index,
            "image_id": sample.image_id,
            "clipped_shapes": int(self.clipped_shapes[index]),
            "lost_regions": self.lost_regions[index].clone(),
        }
        if self.query_slots:
            unpacked = np.unpackbits(self.query_masks[index], axis=-1, count=size * size)
            queries = [q for q in sample.queries if q.finding in self.classes]
            record.update(query_fields(queries, self.classes, self.phrase_row, self.query_slots))
            record.update(query_masks=torch.from_numpy(unpacked.view(bool).reshape(self.query_slots, size, size)),
                          query_has_mask=self.query_has_mask[index].clone(), query_lost=self.query_lost[index].clone())
        if not with_native:
            return record, None
        start, (height, width) = int(self.native_offsets[index]), self.native_shapes[index]
        levels = self._natives[start : start + height * width].reshape(height, width)
        return record, levels.astype(np.float32) / np.float32(IMAGE_LEVELS)
