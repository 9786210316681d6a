"""Golden numbers from cheXlocalize's own evaluation code, for tests/test_precomputed_chexlocalize.py.

    python tools/chexlocalize_golden.py --chexlocalize-repo /path/to/cheXlocalize \\
        --data $XBENCH_REAL_DATA/chexlocalize --out tests/golden/chexlocalize_val.json

Their code is imported from ``--chexlocalize-repo`` (a clone of github.com/rajpurkarlab/cheXlocalize;
it needs their requirements, statsmodels included), never copied. The real Grad-CAM maps
(``gradcam_maps_val.npz``, their sample pickles repacked) are written back as pickles in their
layout (``<cxr_id>_<pathology>_map.pkl``: ``map`` [1, 1, h, w], ``prob``, ``task``, ``cxr_dims``)
in a temporary folder; then, per (CXR, pathology), their ``pkl_to_mask`` binarises at the fixed
threshold 0.5 and by Otsu (contours filled), their ``calculate_iou`` scores both against the mask
from ``gt_segmentations_val.json``, and their ``get_hitrates`` gives the Pointing Game hit; each
segmentation is kept as its pixel count and digest (`segmentation_digest`).

Beside them, `crafted_maps` (maps made here, kept whole in the golden file): holes, islands
in holes, isolated pixels, two-pixel and diagonal components, thin lines, blobs on the border,
upsampled random maps, and float64 maps whose values sit where float32 would round them across a
level of ``uint8(255 s)`` or the fixed threshold. Their pickles go through the same
``pkl_to_mask``; both segmentations are kept whole, row by row.
The pickles' folder is kept with ``--keep-pickles FOLDER`` (the test writes its own).

Run in XBench's environment with statsmodels (their ``utils`` imports it):
``pip install --target /tmp/chexlocalize_deps statsmodels patsy`` and that folder on ``PYTHONPATH``.
"""

from __future__ import annotations

import argparse
import hashlib
import json
import math
import pickle
import sys
import tempfile
from pathlib import Path

import numpy as np
import torch

FIXED_THRESHOLD = 0.5


def write_pickles(npz: Path, folder: Path) -> list[tuple[str, str, Path]]:
    """cheXlocalize's map pickles from the repacked npz; (cxr_id, pathology, path) of each."""
    data = np.load(npz, allow_pickle=False)
    written = []
    for i, cxr_id in enumerate(data["cxr_ids"]):
        width, height = (int(v) for v in data["cxr_dims_wh"][i])
        for t, task in enumerate(data["tasks"]):
            path = folder / f"{cxr_id}_{task}_map.pkl"
            info = {"map": torch.from_numpy(data["maps"][i, t].copy())[None, None], "prob": float(data["probs"][i, t]),
                    "task": str(task), "cxr_dims": (width, height)}
            with open(path, "wb") as handle:
                pickle.dump(info, handle)
            written.append((str(cxr_id), str(task), path))
    return written


def segmentation_digest(segmentation: np.ndarray) -> str:
    """The first 16 hex digits of the sha256 of a binary segmentation's shape and packed bits."""
    bits = np.packbits(np.asarray(segmentation).astype(bool))
    return hashlib.sha256(str(segmentation.shape).encode() + bits.tobytes()).hexdigest()[:16]


def crafted_maps() -> dict[str, tuple[np.ndarray, tuple[int, int]]]:
    """name -> (raw map [h, w], cxr_dims (width, height)): shapes cheXlocalize's contour step
    treats in its own way, at the map's own size (the upsampling is the identity) or upsampled."""
    rng = np.random.default_rng(7)
    shapes = (0.1 * rng.random((24, 32))).astype(np.float32)  # low noise around the shapes
    shapes[23, 0] = 0.0  # the minimum 0 and (below) the maximum 1: min-max normalisation keeps every value
    shapes[2:11, 2:11] = 0.9  # a ring: a 5 x 5 hole with a one-pixel island in it
    shapes[4:9, 4:9] = 0.05
    shapes[6, 6] = 0.9
    shapes[2, 20] = shapes[20, 2] = 1.0  # isolated pixels, the maximum among them
    shapes[15, 20:22] = 0.9  # a two-pixel component
    shapes[18, 25] = shapes[19, 26] = 0.9  # a diagonal pair
    shapes[13:22, 10] = 0.85  # a thin L
    shapes[21, 10:18] = 0.85
    shapes[0:4, 27:32] = 0.8  # a blob on the border with a notch
    shapes[1, 29] = 0.05
    shapes[14:20, 28:31] = 0.9  # a U: an open hole
    shapes[14:18, 29] = 0.05
    holes = np.kron((rng.random((6, 8)) > 0.5), np.ones((4, 4))).astype(np.float32)  # blocks, random holes
    holes += (0.2 * rng.random(holes.shape)).astype(np.float32)
    maps = {
        "shapes": (shapes, (32, 24)),
        "blocks": (holes, (32, 24)),
        "smooth-upsampled": (rng.random((7, 9)).astype(np.float32), (53, 37)),
        "noisy-upsampled": (rng.random((16, 12)).astype(np.float32), (45, 61)),
    }
    # float64: values just below a level k / 255 (float32 rounds them onto it) and just above 0.5
    # (float32 rounds them onto it), so the map rounded to float32 would binarise otherwise
    exact = np.asarray(shapes, dtype=np.float64)
    nudged = exact.copy()
    shape_pixels = (exact > 0.2) & (exact < 1)
    nudged[shape_pixels] = np.round(exact[shape_pixels] * 255) / 255 - 1e-12
    nudged[5:7, 14:18] = 0.5 + 1e-12
    maps["shapes-float64"] = (nudged, (32, 24))
    return maps


def rows(segmentation: np.ndarray) -> list[str]:
    return ["".join("1" if v else "0" for v in row) for row in np.asarray(segmentation).astype(bool)]


def crafted_golden(pkl_to_mask, folder: Path) -> list[dict]:
    """Their Otsu and fixed-threshold segmentations of each crafted map, written as their pickle."""
    out = []
    for name, (raw, (width, height)) in crafted_maps().items():
        path = folder / f"crafted_{name}.pkl"
        with open(path, "wb") as handle:
            pickle.dump({"map": torch.from_numpy(raw)[None, None], "prob": 0.5, "task": "Cardiomegaly",
                         "cxr_dims": (width, height)}, handle)
        out.append({
            "name": name, "dtype": str(raw.dtype), "map": raw.tolist(), "cxr_dims": [width, height],
            "otsu": rows(pkl_to_mask(str(path))), "fixed": rows(pkl_to_mask(str(path), threshold=FIXED_THRESHOLD)),
        })
    return out


def golden(repo: Path, data: Path, folder: Path) -> dict:
    sys.path.insert(0, str(repo))
    from eval import calculate_iou, get_hitrates  # noqa: PLC0415 (their code, from the given clone)
    from heatmap_to_segmentation import pkl_to_mask  # noqa: PLC0415
    from pycocotools import mask as coco_mask  # noqa: PLC0415

    gt_path = data / "gt_segmentations_val.json"
    gt = json.loads(gt_path.read_text())
    pairs = write_pickles(data / "gradcam_maps_val.npz", folder)
    hits, _ = get_hitrates(str(gt_path), str(folder))
    scored = []
    for cxr_id, task, path in pairs:
        gt_mask = coco_mask.decode(gt[cxr_id][task])
        fixed = pkl_to_mask(str(path), threshold=FIXED_THRESHOLD)
        otsu = pkl_to_mask(str(path))
        hit = hits.loc[cxr_id, task]
        scored.append({
            "cxr_id": cxr_id, "task": task, "mask_pixels": int(gt_mask.sum()),
            "iou_fixed": _number(calculate_iou(fixed, gt_mask, true_pos_only=False)),
            "iou_otsu": _number(calculate_iou(otsu, gt_mask, true_pos_only=False)),
            "otsu_pixels": int(otsu.sum()),
            "otsu_digest": segmentation_digest(otsu),
            "fixed_pixels": int(fixed.sum()),
            "fixed_digest": segmentation_digest(fixed),
            "hit": _number(hit),
        })
    return {"made_by": "tools/chexlocalize_golden.py", "fixed_threshold": FIXED_THRESHOLD, "pairs": scored,
            "crafted": crafted_golden(pkl_to_mask, folder)}


def _number(value) -> float | None:
    value = float(value)
    return None if math.isnan(value) else value


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--chexlocalize-repo", type=Path, required=True)
    parser.add_argument("--data", type=Path, required=True, help="the folder with gradcam_maps_val.npz")
    parser.add_argument("--out", type=Path, required=True)
    parser.add_argument("--keep-pickles", type=Path)
    args = parser.parse_args()
    with tempfile.TemporaryDirectory() as temporary:
        folder = args.keep_pickles or Path(temporary)
        folder.mkdir(parents=True, exist_ok=True)
        result = golden(args.chexlocalize_repo.resolve(), args.data, folder)
    args.out.write_text(json.dumps(result, indent=1) + "\n")
    print(f"{len(result['pairs'])} pairs written to {args.out}")


if __name__ == "__main__":
    main()
