"""Golden numbers from cheXlocalize's own evaluation code, for tests/test_precomputed_chexlocalize.py.

    python tools/chexlocalize_golden.py --chexlocalize-repo /path/to/cheXlocalize \\
        --data $XBENCH_REAL_DATA/chexlocalize --out tests/golden/chexlocalize_val.json

Their code is imported from ``--chexlocalize-repo`` (a clone of github.com/rajpurkarlab/cheXlocalize;
it needs their requirements, statsmodels included), never copied. The real Grad-CAM maps
(``gradcam_maps_val.npz``, their sample pickles repacked) are written back as pickles in their
layout (``<cxr_id>_<pathology>_map.pkl``: ``map`` [1, 1, h, w], ``prob``, ``task``, ``cxr_dims``)
in a temporary folder; then, per (CXR, pathology), their ``pkl_to_mask`` binarises at the fixed
threshold 0.5 and by Otsu (contours filled), their ``calculate_iou`` scores both against the mask
from ``gt_segmentations_val.json``, and their ``get_hitrates`` gives the Pointing Game hit.
The pickles' folder is kept with ``--keep-pickles FOLDER`` (the test writes its own).
"""

from __future__ import annotations

import argparse
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


def golden(repo: Path, data: Path, folder: Path) -> dict:
    sys.path.insert(0, str(repo))
    from eval import calculate_iou, get_hitrates  # noqa: PLC0415 (their code, from the given clone)
    from heatmap_to_segmentation import pkl_to_mask  # noqa: PLC0415
    from pycocotools import mask as coco_mask  # noqa: PLC0415

    gt_path = data / "gt_segmentations_val.json"
    gt = json.loads(gt_path.read_text())
    pairs = write_pickles(data / "gradcam_maps_val.npz", folder)
    hits, _ = get_hitrates(str(gt_path), str(folder))
    rows = []
    for cxr_id, task, path in pairs:
        gt_mask = coco_mask.decode(gt[cxr_id][task])
        fixed = pkl_to_mask(str(path), threshold=FIXED_THRESHOLD)
        otsu = pkl_to_mask(str(path))
        hit = hits.loc[cxr_id, task]
        rows.append({
            "cxr_id": cxr_id, "task": task, "mask_pixels": int(gt_mask.sum()),
            "iou_fixed": _number(calculate_iou(fixed, gt_mask, true_pos_only=False)),
            "iou_otsu": _number(calculate_iou(otsu, gt_mask, true_pos_only=False)),
            "otsu_pixels": int(otsu.sum()),
            "hit": _number(hit),
        })
    return {"made_by": "tools/chexlocalize_golden.py", "fixed_threshold": FIXED_THRESHOLD, "pairs": rows}


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
