"""The decoded-image cache: a split's images and masks in the batch geometry, decoded once.

Decoding sets the pace of a benchmark (a 12-bit JPEG 2000 DICOM takes about a second; a ViT
forward about a millisecond on a GPU), and the paper's seven models read the same radiographs.
The first run writes, per split and setting, one memory-mapped file of images (uint16), one of
bit-packed masks and an index; later runs of any model read them.

The folder's name carries a fingerprint of everything the content depends on: the parsed
annotations of every sample, each image (and mask) file's size and modification time, the class
list, ``image_size``, the mask threshold, the augmentation and its seed, the cache format and the
package version. A changed file or setting therefore names a different folder. A cache is written
into a temporary folder and renamed into place when complete, so a half-written cache is never read.

Images are quantised to 16 bits (an error below 1e-5) whether or not the cache is used, so a run
gives identical numbers with and without it.
"""

from __future__ import annotations

import dataclasses
import hashlib
import json
import os
import shutil
import tempfile
from collections.abc import Sequence
from pathlib import Path

import numpy as np
import torch
from rich.progress import track
from torch.utils.data import DataLoader, Dataset

from xbench import __version__

FORMAT = 1
IMAGE_LEVELS = 65535


def quantise(image: torch.Tensor) -> torch.Tensor:
    """The batch image on the 16-bit grid it is cached on (float32, exact round trip)."""
    return torch.round(image * IMAGE_LEVELS) / IMAGE_LEVELS


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
        digest.update(repr((sample.image_id, str(sample.path), sorted(sample.labels.items()), regions)).encode())
        for path in (sample.path, *(p for region in sample.regions.values() for p in _region_files(region))):
            stat = os.stat(path)
            digest.update(f"{stat.st_size}:{stat.st_mtime_ns}".encode())
    return digest.hexdigest()[:20]


def folder_size(folder: Path) -> int:
    return sum(path.stat().st_size for path in folder.iterdir())


def build_cache(folder: Path, dataset: Dataset, num_classes: int, image_size: int, batch_size: int, num_workers: int) -> None:
    """Decode every sample of ``dataset`` (in DataLoader workers) into ``folder``, atomically."""
    folder.parent.mkdir(parents=True, exist_ok=True)
    staging = Path(tempfile.mkdtemp(dir=folder.parent, prefix=f".{folder.name}."))
    try:
        count, pixels = len(dataset), image_size * image_size
        images = np.lib.format.open_memmap(staging / "images.npy", "w+", np.uint16, (count, image_size, image_size))
        masks = np.lib.format.open_memmap(staging / "masks.npy", "w+", np.uint8, (count, num_classes, (pixels + 7) // 8))
        has_mask = np.zeros((count, num_classes), dtype=bool)
        lost = np.zeros((count, num_classes), dtype=bool)
        clipped = np.zeros(count, dtype=np.int64)
        loader = DataLoader(dataset, batch_size=batch_size, num_workers=num_workers)
        for batch in track(loader, description=f"Decoding {count} images into the cache"):
            rows = batch["index"].numpy()
            images[rows] = torch.round(batch["image"][:, 0] * IMAGE_LEVELS).numpy().astype(np.uint16)
            masks[rows] = np.packbits(batch["masks"].numpy().reshape(len(rows), num_classes, pixels), axis=-1)
            has_mask[rows] = batch["has_mask"].numpy()
            lost[rows] = batch["lost_regions"].numpy()
            clipped[rows] = batch["clipped_shapes"].numpy()
        images.flush()
        masks.flush()
        del images, masks
        np.savez(staging / "index.npz", has_mask=has_mask, lost_regions=lost, clipped_shapes=clipped)
        try:
            os.rename(staging, folder)
        except OSError:  # another process finished the same cache first; theirs is identical
            shutil.rmtree(staging, ignore_errors=True)
    except BaseException:
        shutil.rmtree(staging, ignore_errors=True)
        raise


class CachedDataset(Dataset):
    """Samples read back from a cache folder; the same dicts :class:`XBenchDataset` yields."""

    def __init__(self, folder: Path, samples: Sequence, classes: Sequence[str], image_size: int) -> None:
        self.folder = folder
        self.samples = samples
        self.classes = list(classes)
        self.image_size = image_size
        index = np.load(folder / "index.npz")
        self.has_mask = torch.from_numpy(index["has_mask"])
        self.lost_regions = torch.from_numpy(index["lost_regions"])
        self.clipped_shapes = index["clipped_shapes"]
        if len(self.clipped_shapes) != len(samples):
            raise RuntimeError(f"the cache {folder} holds {len(self.clipped_shapes)} samples, the split {len(samples)}")
        self._images: np.ndarray | None = None
        self._masks: np.ndarray | None = None

    def __len__(self) -> int:
        return len(self.samples)

    def __getitem__(self, index: int) -> dict:
        if self._images is None:  # opened in each worker: a memory map does not pickle
            self._images = np.load(self.folder / "images.npy", mmap_mode="r")
            self._masks = np.load(self.folder / "masks.npy", mmap_mode="r")
        size, num_classes = self.image_size, len(self.classes)
        image = torch.from_numpy(self._images[index].astype(np.float32)) / IMAGE_LEVELS
        masks = np.unpackbits(self._masks[index], axis=-1, count=size * size).reshape(num_classes, size, size)
        sample = self.samples[index]
        return {
            "image": image.unsqueeze(0),
            "labels": torch.tensor([float(sample.labels[key]) for key in self.classes]),
            "masks": torch.from_numpy(masks.view(bool)),  # unpackbits gives 0/1 bytes: no copy
            "has_mask": self.has_mask[index].clone(),
            "index": index,
            "image_id": sample.image_id,
            "clipped_shapes": int(self.clipped_shapes[index]),
            "lost_regions": self.lost_regions[index].clone(),
        }
