"""Images per second one DataLoader worker turns from 1024x1024 DICOM into a 224x224 batch tensor,
and the decoded-image cache's cost per image (disk, time) with and without a model's own transform.

    python bench/loading.py [--images 24] [--repeats 3] [--size 1024] [--out 224]

Writes 8-bit DICOMs (uncompressed, and JPEG Baseline as SIIM ships them) with the tests' writer,
then times ``read_image`` + ``resize_image`` in this one process with one torch thread -- what
each worker does per image -- and prints images/s per worker with the read/resize split. Target:
at least 150 images/s per core for uncompressed 8-bit.

Then the cache: phantom PNGs of ``--size``² in ChestX-Det10's layout (and the same images at
2828x2320, a CheXpert-sized radiograph, which the cache caps at 1024 on the shorter side). It
prints the cache's disk per image, the time to build it, and ms per sample read through the
datamodule's dataset, with the cache and without (decoding the file), for the frame alone (a
baseline) and with a model's own transform (MedKLIP's PIL squash to 224, CARZero's OpenCV
letterbox). Times are this process's CPU time (``time.process_time``), so other load on a shared
machine does not count against it.
"""

from __future__ import annotations

import argparse
import os
import sys
import tempfile
import time
from pathlib import Path

import numpy as np
import torch

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "tests"))
from conftest import write_dicom  # noqa: E402  (the one DICOM writer, shared with the tests)

from PIL import Image  # noqa: E402

from xbench.data.base import ModelInputDataset  # noqa: E402
from xbench.data.cache import folder_size  # noqa: E402
from xbench.data.io import read_image  # noqa: E402
from xbench.data.phantom import Phantom, generate_phantom  # noqa: E402
from xbench.data.transforms import resize_image  # noqa: E402
from xbench.models.preprocess import CXR_MAE_MEAN, CXR_MAE_STD, Preprocess  # noqa: E402

TRANSFORMS = {
    "frame only (no model transform)": None,
    "MedKLIP (PIL squash 224)": Preprocess(224),
    "CARZero (OpenCV letterbox 256, crop 224)": Preprocess(
        224, resize="longer_side", resize_to=256, interpolation="area", library="cv2", mean=CXR_MAE_MEAN, std=CXR_MAE_STD
    ),
}


def radiograph_like(rng: np.random.Generator, size: int, width: int | None = None) -> np.ndarray:
    """Smooth large-scale shading plus pixel noise: about the entropy of a chest radiograph.
    ``size`` x ``width`` (default square), 8-bit."""
    width = width or size
    xx, yy = np.meshgrid(np.linspace(-1, 1, width), np.linspace(-1, 1, size))
    shading = 120 + 70 * np.cos(2.2 * xx) * np.cos(1.6 * yy + rng.uniform(0, 1)) + 30 * yy
    return np.clip(shading + rng.normal(0, 6, (size, width)), 0, 255).astype(np.uint8)


def best_rate(paths: list[Path], out: int, repeats: int) -> tuple[float, float, float]:
    """Best of ``repeats`` passes: images/s, and mean ms per image for reading and resizing."""
    best = (0.0, 0.0, 0.0)
    for _ in range(repeats):
        read_s = resize_s = 0.0
        for path in paths:
            start = time.process_time()
            image = read_image(path)
            middle = time.process_time()
            resize_image(image, out)
            resize_s += time.process_time() - middle
            read_s += middle - start
        rate = len(paths) / (read_s + resize_s)
        if rate > best[0]:
            best = (rate, 1000 * read_s / len(paths), 1000 * resize_s / len(paths))
    return best


def ms_per_sample(dataset, repeats: int) -> float:
    """Best of ``repeats`` passes over ``dataset``: CPU ms per sample."""
    best = float("inf")
    for _ in range(repeats):
        start = time.process_time()
        for index in range(len(dataset)):
            dataset[index]
        best = min(best, (time.process_time() - start) / len(dataset))
    return 1000 * best


def widen(root: Path, height: int, width: int) -> None:
    """Resize every phantom PNG under ``root`` to ``height x width`` (a non-square native image)."""
    for path in (root / "test_data").glob("*.png"):
        Image.open(path).resize((width, height), Image.BILINEAR).save(path)


def cache_costs(folder: Path, images: int, size: int, out: int, repeats: int) -> None:
    for label, shape in ((f"{size}x{size} PNG", None), ("2320x2828 PNG (capped)", (2320, 2828))):
        root = folder / f"phantom-{size}-{shape}"
        generate_phantom(root, images, size, seed=0)
        if shape is not None:
            widen(root, *shape)
        cached = Phantom(root=str(root), image_size=out, num_workers=0, batch_size=8)
        start = time.process_time()
        cached.prepare_data()
        build_ms = 1000 * (time.process_time() - start) / images
        cached.setup()
        decoding = Phantom(root=str(root), image_size=out, num_workers=0, cache=False)
        decoding.setup()
        disk = folder_size(cached.cache_folder()) / images / 2**20
        print(f"  {label}: cache {disk:.2f} MiB per image, built in {build_ms:.1f} ms per image")
        for name, transform in TRANSFORMS.items():
            rates = []
            for module in (cached, decoding):
                dataset = module.test_set if transform is None else ModelInputDataset(module.test_set, transform, out)
                rates.append(ms_per_sample(dataset, repeats))
            print(f"    {name:<42} cache {rates[0]:6.2f} ms   no cache {rates[1]:6.2f} ms per sample")


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--images", type=int, default=24)
    parser.add_argument("--repeats", type=int, default=3)
    parser.add_argument("--size", type=int, default=1024)
    parser.add_argument("--out", type=int, default=224)
    args = parser.parse_args()
    torch.set_num_threads(1)
    rng = np.random.default_rng(0)
    with tempfile.TemporaryDirectory() as folder:
        kinds = {"uncompressed 8-bit": None, "JPEG Baseline 8-bit": "jpeg"}
        paths: dict[str, list[Path]] = {kind: [] for kind in kinds}
        for i in range(args.images):
            pixels = radiograph_like(rng, args.size)
            for kind, compression in kinds.items():
                path = Path(folder) / f"{compression or 'raw'}_{i}.dcm"
                write_dicom(path, pixels, compression=compression)
                paths[kind].append(path)
        print(f"{args.size}x{args.size} DICOM -> {args.out}x{args.out} tensor, one process, one torch thread")
        for kind in kinds:
            rate, read_ms, resize_ms = best_rate(paths[kind], args.out, args.repeats)
            print(f"  {kind:<20} {rate:7.1f} images/s per worker  (read {read_ms:.2f} ms + resize {resize_ms:.2f} ms)")
        os.environ["XBENCH_CACHE"] = str(Path(folder) / "cache")
        print(f"Decoded-image cache ({args.images} phantom images, 3 classes, frame {args.out}, one process):")
        cache_costs(Path(folder), args.images, args.size, args.out, args.repeats)


if __name__ == "__main__":
    main()
