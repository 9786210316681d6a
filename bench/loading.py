"""Images per second one DataLoader worker turns from 1024x1024 DICOM into a 224x224 batch tensor,
and the decoded-image cache's cost per image (disk, time) with and without a model's own transform.

    python bench/loading.py [--images 8] [--repeats 3] [--size 1024] [--out 224]

Writes 8-bit DICOMs (uncompressed, and JPEG Baseline as SIIM ships them) with the tests' writer,
then times ``read_image`` + ``resize_image`` in this one process with one torch thread -- what
each worker does per image -- and prints images/s per worker with the read/resize split. Target:
at least 150 images/s per core for uncompressed 8-bit.

Then the cache, on radiograph-like images in ChestX-Det10's layout (one box each) of three kinds:
``--size``² 8-bit PNG, a CheXpert-size JPEG (2828x2320) and a VinDr-size 12-bit JPEG 2000 DICOM
(2800x2400, MONOCHROME1). Per image it prints the file's size, the cache's disk, the time to
build it, the native image's read with its hash check, the codes stored another way (zlib or
PNG: the disk they would take and the time to read them back), and ms per sample read
through the datamodule's dataset with the cache and without (decoding the file), for the frame
alone (what baselines read) and with a model's own transform (MedKLIP's PIL squash to 224,
CARZero's OpenCV letterbox, BioViL's range stretch and PIL resize to 512). Times are this process's
CPU time (``time.process_time``; one torch and one OpenCV thread, as a worker), so other load on a
shared machine counts little; reads with the cache are the best of ``--repeats`` passes, reads
without it one pass (decoding dominates them).
"""

from __future__ import annotations

import argparse
import json
import os
import sys
import tempfile
import time
import zlib
from pathlib import Path

import cv2
import numpy as np
import torch

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "tests"))
from conftest import write_dicom  # noqa: E402  (the one DICOM writer, shared with the tests)

from PIL import Image  # noqa: E402

from xbench.data.base import ModelInputDataset  # noqa: E402
from xbench.data.cache import folder_size  # noqa: E402
from xbench.data.chestx_det10 import ChestXDet10  # noqa: E402
from xbench.data.io import read_image  # noqa: E402
from xbench.data.transforms import resize_image  # noqa: E402
from xbench.models.biovil import BioViL  # noqa: E402
from xbench.geometry.preprocess import CXR_MAE_MEAN, CXR_MAE_STD, Preprocess  # noqa: E402

TRANSFORMS = {
    "frame only (no model transform)": None,
    "MedKLIP (PIL squash 224)": Preprocess(224),
    "CARZero (OpenCV letterbox 256, crop 224)": Preprocess(
        224, resize="longer_side", resize_to=256, interpolation="area", library="cv2", mean=CXR_MAE_MEAN, std=CXR_MAE_STD
    ),
    "BioViL (range stretch, PIL 512, crop 480)": BioViL.preprocess,
}


def radiograph_like(rng: np.random.Generator, size: int, width: int | None = None) -> np.ndarray:
    """Smooth large-scale shading plus pixel noise: about the entropy of a chest radiograph.
    ``size`` x ``width`` (default square), 8-bit."""
    width = width or size
    xx, yy = np.meshgrid(np.linspace(-1, 1, width), np.linspace(-1, 1, size))
    shading = 120 + 70 * np.cos(2.2 * xx) * np.cos(1.6 * yy + rng.uniform(0, 1)) + 30 * yy
    return np.clip(shading + rng.normal(0, 6, (size, width)), 0, 255).astype(np.uint8)


def write_like(path: Path, kind: str, shape: tuple[int, int], bits: int, rng: np.random.Generator) -> Path:
    """A radiograph-like file of ``kind`` (``png``, ``jpeg``, ``dicom``, ``dicom-jpeg``, ``dicom-j2k``),
    ``shape`` = (height, width); ``bits`` 16 writes a DICOM with 12 bits stored, as VinDr's."""
    pixels = radiograph_like(rng, *shape)
    if kind.startswith("dicom"):
        compression = {"dicom": None, "dicom-jpeg": "jpeg", "dicom-j2k": "j2k"}[kind]
        extra = {"BitsStored": 12, "PhotometricInterpretation": "MONOCHROME1"} if bits == 16 else {}
        if bits == 16:  # 12 bits stored, as VinDr's: the 8-bit shading widened, with its own noise
            pixels = pixels.astype(np.uint16) * 16 + rng.integers(0, 16, size=shape, dtype=np.uint16)
        write_dicom(path.with_suffix(".dcm"), pixels, compression=compression, **extra)
        return path.with_suffix(".dcm")
    path = path.with_suffix(".png" if kind == "png" else ".jpg")
    Image.fromarray(pixels).save(path, **({"quality": 95} if kind == "jpeg" else {}))
    return path


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


def best_ms(fn, repeats: int) -> float:
    best = float("inf")
    for _ in range(repeats):
        start = time.process_time()
        fn()
        best = min(best, time.process_time() - start)
    return 1000 * best


def storage_options(codes: np.ndarray, repeats: int) -> str:
    """The codes of one image kept raw (a copy out of the page cache), zlib-compressed (level 1) or
    as a PNG (OpenCV, level 1): the share of the raw size each takes and ms to read it back."""
    packed = zlib.compress(codes.tobytes(), 1)
    png = cv2.imencode(".png", codes, [cv2.IMWRITE_PNG_COMPRESSION, 1])[1]
    options = {
        "raw": (1.0, best_ms(lambda: np.array(codes), repeats)),
        "zlib": (len(packed) / codes.nbytes, best_ms(lambda: zlib.decompress(packed), repeats)),
        "PNG": (png.nbytes / codes.nbytes, best_ms(lambda: cv2.imdecode(png, cv2.IMREAD_UNCHANGED), repeats)),
    }
    return ", ".join(f"{name} {share:.0%} of the size, read in {ms:.1f} ms" for name, (share, ms) in options.items())


def write_split(root: Path, images: int, kind: str, shape: tuple[int, int], bits: int) -> float:
    """``images`` files like ``kind`` in ChestX-Det10's layout, one box each; returns MiB per file."""
    (root / "test_data").mkdir(parents=True)
    rng = np.random.default_rng(0)
    entries, size = [], 0
    for i in range(images):
        path = write_like(root / "test_data" / f"{i}", kind, shape, bits, rng)
        size += path.stat().st_size
        height, width = shape
        entries.append({"file_name": path.name, "syms": ["Mass"], "boxes": [[width // 5, height // 4, width // 2, height // 2]]})
    (root / "test.json").write_text(json.dumps(entries))
    return size / images / 2**20


def cache_costs(folder: Path, images: int, size: int, out: int, repeats: int) -> None:
    kinds = {
        f"{size}x{size} PNG, 8-bit": ("png", (size, size), 8),
        "2828x2320 JPEG (CheXpert size)": ("jpeg", (2320, 2828), 8),
        "2800x2400 12-bit JPEG 2000 DICOM (VinDr size)": ("dicom-j2k", (2400, 2800), 16),
    }
    for label, (kind, shape, bits) in kinds.items():
        root = folder / kind
        file_mib = write_split(root, images, kind, shape, bits)
        cached = ChestXDet10(root=str(root), classes=["mass"], image_size=out, num_workers=0, batch_size=8)
        start = time.process_time()
        cached.prepare_data()
        build_ms = 1000 * (time.process_time() - start) / images
        cached.setup()
        decoding = ChestXDet10(root=str(root), classes=["mass"], image_size=out, num_workers=0, cache=False)
        decoding.setup()
        disk = folder_size(cached.cache_folder()) / images / 2**20
        cached.test_set.item(0, True)  # opens the memory maps
        start = time.process_time()
        for _ in range(repeats):
            for index in range(images):
                cached.test_set.native(index)  # the hash check, and views of the codes and levels
        native_ms = 1000 * (time.process_time() - start) / repeats / images
        print(f"  {label}: file {file_mib:.2f} MiB; cache {disk:.2f} MiB per image, built in {build_ms:.0f} ms per "
              f"image; the native image's read and hash check {native_ms:.2f} ms")
        print(f"    the codes stored {storage_options(cached.test_set.native(0).codes, repeats)}")
        for name, transform in TRANSFORMS.items():
            rates = []
            for module, passes in ((cached, repeats), (decoding, 1)):
                dataset = module.test_set if transform is None else ModelInputDataset(module.test_set, transform, out)
                rates.append(ms_per_sample(dataset, passes))
            print(f"    {name:<42} cache {rates[0]:6.1f} ms   no cache {rates[1]:7.1f} ms per sample")


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--images", type=int, default=8)
    parser.add_argument("--repeats", type=int, default=3)
    parser.add_argument("--size", type=int, default=1024)
    parser.add_argument("--out", type=int, default=224)
    args = parser.parse_args()
    torch.set_num_threads(1)
    cv2.setNumThreads(1)
    rng = np.random.default_rng(0)
    print(f"{time.strftime('%Y-%m-%d %H:%M')}, {os.cpu_count()} CPUs, load average {os.getloadavg()[0]:.2f}")
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
        print(f"Decoded-image cache ({args.images} images per kind, 1 class, frame {args.out}, one process):")
        cache_costs(Path(folder), args.images, args.size, args.out, args.repeats)
        print(f"load average at the end {os.getloadavg()[0]:.2f}")


if __name__ == "__main__":
    main()
