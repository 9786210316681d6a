"""How fast, and how exact, is the batch geometry's resize against OpenCV and albumentations?

    python bench/resize.py [--repeats 7] [--out 224]

For a 1024 x 1024 and a 2320 x 2828 (H x W) float32 radiograph and a bool region mask of the
same size, times each way of resizing to ``out x out`` in this process with one thread (torch and
OpenCV both), as a DataLoader worker runs it: best of ``--repeats``, in process CPU time
(``time.process_time``), so other load on a shared machine does not count against it.

- images: ``xbench.data.transforms.resize_image`` (torch, bilinear, antialiased), ``cv2.resize``
  with ``INTER_AREA``, and albumentations ``Resize(interpolation=INTER_AREA)``;
- masks: ``xbench.data.transforms.resize_mask`` (exact integer area coverage, binarised at
  gamma = 0.5, never vanishing) and ``cv2.resize(INTER_AREA)`` of the mask as float32 / float64
  then ``>= 0.5``.

Then the exactness check that decides the mask method: OpenCV's coverage against the exact one
(largest error), and how many output pixels OpenCV binarises differently from the rule
"coverage >= gamma" -- on random boxes, and on boxes whose edge cuts output pixels exactly in half,
where OpenCV's float rounding, a hair below 0.5, drops the pixel.
"""

from __future__ import annotations

import argparse
import time

import albumentations as A
import cv2
import numpy as np
import torch

from xbench.data.transforms import area_coverage, resize_image, resize_mask

SHAPES = ((1024, 1024), (2320, 2828))


def best_ms(function, repeats: int) -> float:
    best = float("inf")
    for _ in range(repeats):
        start = time.process_time()
        function()
        best = min(best, time.process_time() - start)
    return 1000 * best


def radiograph(shape: tuple[int, int], rng: np.random.Generator) -> np.ndarray:
    yy, xx = np.meshgrid(np.linspace(-1, 1, shape[0]), np.linspace(-1, 1, shape[1]), indexing="ij")
    image = 0.5 + 0.3 * np.cos(2.2 * xx) * np.cos(1.6 * yy) + rng.normal(0, 0.03, shape)
    return np.clip(image, 0, 1).astype(np.float32)


def region(shape: tuple[int, int]) -> np.ndarray:
    yy, xx = np.meshgrid(np.arange(shape[0]), np.arange(shape[1]), indexing="ij")
    return ((yy - 0.4 * shape[0]) / (0.12 * shape[0])) ** 2 + ((xx - 0.3 * shape[1]) / (0.1 * shape[1])) ** 2 < 1


def timings(out: int, repeats: int) -> None:
    rng = np.random.default_rng(0)
    area = A.Resize(out, out, interpolation=cv2.INTER_AREA)
    print(f"| resize to {out}² (ms, best of {repeats}, 1 thread) | " + " | ".join(f"{h}×{w}" for h, w in SHAPES) + " |")
    print("|---|" + "---:|" * len(SHAPES))
    images = [radiograph(shape, rng) for shape in SHAPES]
    masks = [region(shape) for shape in SHAPES]
    rows = {
        "image: torch bilinear, antialiased (XBench)": [lambda i=i: resize_image(i, out) for i in images],
        "image: cv2 INTER_AREA": [lambda i=i: cv2.resize(i, (out, out), interpolation=cv2.INTER_AREA) for i in images],
        "image: albumentations Resize(INTER_AREA)": [lambda i=i: area(image=i)["image"] for i in images],
        "mask: exact integer area coverage (XBench)": [lambda m=m: resize_mask(m, out) for m in masks],
        "mask: cv2 INTER_AREA on float32, ≥ 0.5": [
            lambda m=m: cv2.resize(m.astype(np.float32), (out, out), interpolation=cv2.INTER_AREA) >= 0.5 for m in masks],
        "mask: cv2 INTER_AREA on float64, ≥ 0.5": [
            lambda m=m: cv2.resize(m.astype(np.float64), (out, out), interpolation=cv2.INTER_AREA) >= 0.5 for m in masks],
    }
    for name, functions in rows.items():
        print(f"| {name} | " + " | ".join(f"{best_ms(f, repeats):.1f}" for f in functions) + " |")


def half_covered_boxes(side: int, out: int, count: int, rng: np.random.Generator) -> list[np.ndarray]:
    """Boxes in a ``side``-square image whose right edge cuts a column of output pixels exactly in half
    (coverage exactly 0.5 = gamma) and whose other edges fall on output-pixel borders."""
    halves = [m for m in range(1, side) if (2 * m * out) % side == 0 and (2 * m * out // side) % 2 == 1]
    borders = [m for m in range(side + 1) if (m * out) % side == 0]
    boxes = []
    for _ in range(count if halves else 0):
        top, bottom = sorted(rng.choice(borders, 2, replace=False))
        mask = np.zeros((side, side), dtype=bool)
        mask[top:bottom, :rng.choice(halves)] = True
        boxes.append(mask)
    return boxes


def exactness(out: int, boxes: int) -> None:
    """OpenCV's area coverage against the exact one: the largest error over random boxes, and the
    output pixels it binarises differently -- on random boxes, and on boxes built so that whole
    columns of output pixels are covered exactly half (where OpenCV's rounding decides the pixel)."""
    rng = np.random.default_rng(1)
    cases = {}
    for shape in SHAPES:
        masks = []
        for _ in range(boxes):
            mask = np.zeros(shape, dtype=bool)
            y0, x0 = rng.integers(0, shape[0] // 2), rng.integers(0, shape[1] // 2)
            mask[y0:y0 + rng.integers(1, shape[0] // 2), x0:x0 + rng.integers(1, shape[1] // 2)] = True
            masks.append(mask)
        cases[f"{shape[0]}×{shape[1]}, random boxes"] = masks
    for side in (1024, 1216, 1472):
        cases[f"{side}×{side}, boxes cutting pixels in half"] = half_covered_boxes(side, out, boxes // 4, rng)
    print(f"\nExactness of cv2 INTER_AREA against the exact coverage, resized to {out}², binarised at 0.5:")
    print("| masks | cv2 dtype | largest coverage error | output pixels at coverage exactly 0.5 "
          "| pixels binarised differently |")
    print("|---|---|---:|---:|---:|")
    for name, masks in cases.items():
        for dtype in (np.float32, np.float64):
            error, half, flipped = 0.0, 0, 0
            for mask in masks:
                exact = area_coverage(mask, out, out)  # integers in units of 1 / (H W)
                full = mask.shape[0] * mask.shape[1]
                approximate = cv2.resize(mask.astype(dtype), (out, out), interpolation=cv2.INTER_AREA)
                error = max(error, float(np.abs(approximate.astype(np.float64) - exact / full).max()))
                half += int((2 * exact == full).sum())
                flipped += int(((approximate >= 0.5) != (2 * exact >= full)).sum())
            print(f"| {name} ({len(masks)}) | {np.dtype(dtype).name} | {error:.1e} | {half} | {flipped} |")


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--repeats", type=int, default=7)
    parser.add_argument("--out", type=int, default=224)
    parser.add_argument("--boxes", type=int, default=200, help="random boxes per shape in the exactness check "
                                                                "(a quarter as many half-cutting boxes per side)")
    options = parser.parse_args()
    torch.set_num_threads(1)
    cv2.setNumThreads(1)
    print(f"torch {torch.__version__}, OpenCV {cv2.__version__}, albumentations {A.__version__}\n")
    timings(options.out, options.repeats)
    exactness(options.out, options.boxes)


if __name__ == "__main__":
    main()
