"""Images per second one DataLoader worker turns from 1024x1024 DICOM into a 224x224 batch tensor.

    python bench/loading.py [--images 24] [--repeats 3] [--size 1024] [--out 224]

Writes 8-bit DICOMs (uncompressed, and JPEG Baseline as SIIM ships them) with the tests' writer,
then times ``read_image`` + ``resize_image`` in this one process with one torch thread -- what
each worker does per image -- and prints images/s per worker with the read/resize split. Times
are this process's CPU time (``time.process_time``), so other load on a shared machine does not
count against it. Target: at least 150 images/s per core for uncompressed 8-bit.
"""

from __future__ import annotations

import argparse
import sys
import tempfile
import time
from pathlib import Path

import numpy as np
import torch

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "tests"))
from conftest import write_dicom  # noqa: E402  (the one DICOM writer, shared with the tests)

from xbench.data.io import read_image  # noqa: E402
from xbench.data.transforms import resize_image  # noqa: E402


def radiograph_like(rng: np.random.Generator, size: int) -> np.ndarray:
    """Smooth large-scale shading plus pixel noise: about the entropy of a chest radiograph."""
    axis = np.linspace(-1, 1, size)
    xx, yy = np.meshgrid(axis, axis)
    shading = 120 + 70 * np.cos(2.2 * xx) * np.cos(1.6 * yy + rng.uniform(0, 1)) + 30 * yy
    return np.clip(shading + rng.normal(0, 6, (size, size)), 0, 255).astype(np.uint8)


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


if __name__ == "__main__":
    main()
