"""Golden maps of hi-ml's phrase-grounding placement, and CNR on them, for ``--model.phrase_protocol hi-ml``.

Development only; the authors' package (``microsoft/hi-ml``, ``hi-ml-multimodal``) is imported
from ``--authors-repo`` (as fetched), never copied. Their ``ImageTextInferenceEngine.
convert_similarity_to_image_size`` -- the step of ``get_similarity_map_from_raw_data`` that puts a
patch-similarity map onto the image at its native size, ``NaN`` outside the model's centre crop --
runs on seeded random maps for the transforms of `CASES` (BioViL's 512/480 and BioViL-T's
512/448 with their default ``nearest``, the notebook's ``bilinear``, a CLIP-style 224/224 and a
map over the whole image without a crop) on portrait, landscape, square and extreme-aspect images.
hi-ml has no CNR code; the BioViL paper's CNR, ``|mean_in - mean_out| / sqrt(var_in + var_out)``
over the pixels that are not NaN (population variances, float64), is computed plainly here
beside each of their maps against a box drawn at native size.

    PYTHONPATH=$PWD:/tmp/newmodels_deps .venv/bin/python tools/parity/himl_phrase_grounding.py \\
        --authors-repo /tmp/ar/hi-ml --out tests/golden/himl_phrase_grounding.npz

Their package imports SimpleITK (in ``/tmp/newmodels_deps``, tests/golden/README.md). The file holds, per case ``i``: ``<i>_map`` (the raw map [h, w], float32), ``<i>_native`` (their
map at native size, float32 with NaN), ``<i>_box`` ([x1, y1, x2, y2], native pixels, half-open)
and ``<i>_cnr`` (float64); ``meta`` (JSON: each case's image size, resize, crop, interpolation; the
commit; versions).
"""

from __future__ import annotations

import argparse
import json
import subprocess
import sys
from pathlib import Path

import numpy as np
import torch

#: (name, grid (h, w), image (width, height), resize_size, crop_size, interpolation).
CASES = (
    ("biovil-portrait", (15, 15), (97, 131), 512, 480, "nearest"),
    ("biovil-landscape", (15, 15), (131, 97), 512, 480, "nearest"),
    ("biovil_t-square", (14, 14), (120, 120), 512, 448, "nearest"),
    ("biovil_t-extreme", (14, 14), (61, 200), 512, 448, "nearest"),
    ("notebook-bilinear", (15, 15), (150, 110), 512, 480, "bilinear"),
    ("clip-landscape", (7, 7), (90, 64), 224, 224, "bilinear"),
    ("whole-image", (8, 8), (70, 50), None, None, "bilinear"),
)
SEED = 0


def plain_cnr(native: np.ndarray, box: list[int]) -> float:
    """CNR over the pixels that are not NaN: the box's inside against the rest, in float64."""
    x1, y1, x2, y2 = box
    inside = np.zeros(native.shape, dtype=bool)
    inside[y1:y2, x1:x2] = True
    seen = ~np.isnan(native)
    values = native.astype(np.float64)
    a, b = values[inside & seen], values[~inside & seen]
    return float(abs(a.mean() - b.mean()) / np.sqrt(a.var() + b.var()))


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--authors-repo", type=Path, required=True)
    parser.add_argument("--out", type=Path, default=Path("tests/golden/himl_phrase_grounding.npz"))
    args = parser.parse_args(argv)
    sys.path.insert(0, str(args.authors_repo / "hi-ml-multimodal" / "src"))
    from health_multimodal.vlp import ImageTextInferenceEngine  # their code, from the given clone

    rng = np.random.default_rng(SEED)
    arrays, cases = {}, []
    for index, (name, grid, (width, height), resize, crop, interpolation) in enumerate(CASES):
        raw = rng.random(grid).astype(np.float32)
        native = ImageTextInferenceEngine.convert_similarity_to_image_size(
            torch.from_numpy(raw), width=width, height=height, resize_size=resize, crop_size=crop,
            interpolation=interpolation)
        x1, y1 = int(rng.integers(0, width // 2)), int(rng.integers(0, height // 2))
        box = [x1, y1, int(rng.integers(x1 + 1, width + 1)), int(rng.integers(y1 + 1, height + 1))]
        arrays.update({f"{index}_map": raw, f"{index}_native": native.astype(np.float32),
                       f"{index}_box": np.array(box), f"{index}_cnr": np.float64(plain_cnr(native, box))})
        cases.append({"name": name, "image_width_height": [width, height], "resize_size": resize, "crop_size": crop,
                      "interpolation": interpolation})
    commit = subprocess.run(["git", "-C", str(args.authors_repo), "rev-parse", "HEAD"], capture_output=True,
                            text=True, check=True).stdout.strip()
    meta = {"authors_repo": "microsoft/hi-ml", "commit": commit, "function":
            "ImageTextInferenceEngine.convert_similarity_to_image_size", "seed": SEED, "cases": cases,
            "cnr": "BioViL's CNR over the non-NaN pixels, float64 (hi-ml has no CNR code)",
            "versions": {"torch": torch.__version__, "numpy": np.__version__}}
    args.out.parent.mkdir(parents=True, exist_ok=True)
    np.savez_compressed(args.out, meta=np.array(json.dumps(meta, indent=1)), **arrays)
    print(f"wrote {args.out}: {len(CASES)} cases, CNR " + ", ".join(f"{arrays[f'{i}_cnr']:.4f}" for i in range(len(CASES))))


if __name__ == "__main__":
    main()
