"""How far the peers' protocols move the numbers: phrase grounding in XBench's frame or as hi-ml
scores it, and CNR with or without the pixels a model never saw (the figures docs/phrase-grounding.md
quotes); with ``--chexlocalize FOLDER``, cheXlocalize's rules on their real Grad-CAM maps (the
figures docs/saved-outputs.md quotes).

    python tools/protocol_differences.py [--pairs 200] [--seed 0]
    python tools/protocol_differences.py --chexlocalize $XBENCH_REAL_DATA/chexlocalize

A fixture of seeded random pairs: BioViL's transform (shorter side to 512, centre crop 480, maps
15 x 15 placed ``nearest``) on MS-CXR-like native sizes (portrait 2544 x 3056 and landscape
3056 x 2544, width x height, and a square 2048), a raw map of Gaussian-smoothed noise (BioViL's
sigma of 1.5 cells) and one box per pair (5 to 40 % of each side). Each pair is scored three ways:
in the 224 x 224 frame with CNR over every frame pixel (XBench before the seen pixels), in the
frame with CNR over the seen pixels (XBench's protocol), and at native size as hi-ml places the map
(``--model.phrase_protocol hi-ml``). Prints the mean of each value and the mean absolute difference.
Minutes on a CPU: every native-size pair has millions of pixels.

cheXlocalize (``gradcam_maps_val.npz`` and ``gt_segmentations_val.json`` in FOLDER: 2 CXRs x 10
findings): per pair with a region, whether their default ``true_pos_only`` leaves its fixed-threshold
(0.5) or Otsu IoU out, and the means with and without that rule; then each map made float64 with
detail below float32's resolution (a seeded uniform offset of up to 2^-25 of its spread) and scored
by XBench's values (min-max normalised in float64, then float32) against the same map kept in float64
throughout: the pixel-threshold decisions (s >= tau_k, 101 thresholds) that differ, in the 224 x 224
frame and at native size.
"""

from __future__ import annotations

import argparse
import json
from pathlib import Path

import numpy as np
import torch

from xbench.data.regions import Boxes, CocoRLE
from xbench.data.transforms import resize_mask
from xbench.geometry.maps import as_float32, normalise, place_in_frame, seen_pixels, whole_frame
from xbench.geometry.preprocess import Preprocess
from xbench.metrics import grounding_records
from xbench.metrics.grounding import FIXED_TAU_INDEX, THRESHOLDS, pair_scores
from xbench.metrics.native import himl_native_saliency, native_pair_scores, native_upsample
from xbench.models.biovil import gaussian_smooth

FRAME = 224
SIZES = ((3056, 2544), (2544, 3056), (2048, 2048))  # (height, width)
PREPROCESS = Preprocess(480, "shorter_side", resize_to=512, map_upsample="nearest")


def scores(saliency, mask, seen) -> tuple[float, float, float]:
    """Pointing Game hit, Dice at 0.5 and CNR of one pair."""
    records = grounding_records(saliency, mask[None, None], torch.ones(1, 1, dtype=torch.bool), seen)
    dice, _ = pair_scores(records["predicted"], records["inter"])
    return float(records["hit"]), float(dice[0, 0, FIXED_TAU_INDEX]), float(records["cnr"])


def threshold_bins(saliency: torch.Tensor) -> torch.Tensor:
    """How many of the 101 thresholds (float32 k / 100) each value reaches (``s >= tau_k``)."""
    return torch.bucketize(saliency.double(), THRESHOLDS.double(), right=True)


def chexlocalize(folder: Path, seed: int) -> None:
    """cheXlocalize's rules on their real maps (see the module docstring)."""
    data = np.load(folder / "gradcam_maps_val.npz")
    segmentations = json.loads((folder / "gt_segmentations_val.json").read_text())
    rng = np.random.default_rng(seed)
    graded, left_out, means = 0, {"iou_fixed": 0, "iou_otsu": 0}, {"iou_fixed": [], "iou_otsu": []}
    moved = {"frame": [0, 0], "native": [0, 0]}  # decisions moved, decisions made
    for i, cxr_id in enumerate(data["cxr_ids"]):
        width, height = (int(v) for v in data["cxr_dims_wh"][i])
        for t, task in enumerate(data["tasks"]):
            raw = torch.from_numpy(data["maps"][i, t].copy())
            mask, _ = CocoRLE.from_json(segmentations[cxr_id][task], "gt").to_mask(height, width)
            if mask.any():
                graded += 1
                scores = native_pair_scores(raw, torch.from_numpy(mask))
                for name in left_out:
                    left_out[name] += int(np.isnan(scores[name]))
                    means[name].append(scores[name])
            spread = float(raw.max() - raw.min())
            detailed = raw.double() + torch.from_numpy(rng.uniform(0, spread * 2**-25, raw.shape))
            for where, size in (("frame", (224, 224)), ("native", (height, width))):
                windows = whole_frame(1, size, raw.device)
                ours = normalise(place_in_frame(as_float32(detailed[None, None]), windows, size))
                exact = normalise(native_upsample(detailed, size)[None, None])
                moved[where][0] += int((threshold_bins(ours) - threshold_bins(exact)).abs().sum())
                moved[where][1] += ours.numel() * len(THRESHOLDS)
    print(f"cheXlocalize: {graded} pairs with a region; their true_pos_only leaves out {left_out['iou_fixed']} "
          f"fixed-threshold and {left_out['iou_otsu']} Otsu IoUs")
    for name, values in means.items():
        values = np.array(values)
        print(f"  mean {name}: their rule {np.nanmean(values):.4f}, an empty segmentation as 0 "
              f"{np.nan_to_num(values).mean():.4f}")
    for where, (changed, decisions) in moved.items():
        print(f"  float64 maps, {where}: {changed} of {decisions:,} pixel-threshold decisions differ from float64")


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--pairs", type=int, default=200)
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--chexlocalize", type=Path, help="a folder of cheXlocalize's val maps and segmentations")
    args = parser.parse_args(argv)
    if args.chexlocalize is not None:
        chexlocalize(args.chexlocalize, args.seed)
        return
    rng = np.random.default_rng(args.seed)
    rows = []
    for pair in range(args.pairs):
        height, width = SIZES[pair % len(SIZES)]
        _, window = PREPROCESS(np.zeros((height, width), dtype=np.float32), FRAME)
        raw = gaussian_smooth(torch.from_numpy(rng.random((1, 1, 15, 15), dtype=np.float32)))
        box_height, box_width = (int(rng.uniform(0.05, 0.4) * side) for side in (height, width))
        top, left = int(rng.integers(0, height - box_height)), int(rng.integers(0, width - box_width))
        native_mask, _ = Boxes(((left, top, left + box_width, top + box_height),)).to_mask(height, width)
        frame_mask = resize_mask(native_mask, FRAME)
        frame_saliency = normalise(place_in_frame(raw, window[None], (FRAME, FRAME), "nearest"))
        frame_seen = seen_pixels(window[None], (FRAME, FRAME))
        native_saliency, native_seen = himl_native_saliency(raw, PREPROCESS, window, (FRAME, FRAME), (height, width),
                                                            "nearest")
        rows.append([*scores(frame_saliency, frame_mask, None)[2:], *scores(frame_saliency, frame_mask, frame_seen),
                     *scores(native_saliency, torch.from_numpy(native_mask), native_seen)])
    table = np.array(rows)  # CNR all pixels; frame hit, Dice, CNR; native hit, Dice, CNR
    unseen = np.isnan(table[:, 3]) | np.isnan(table[:, 6])  # a box the model never saw: no CNR
    cnr = table[~unseen]
    print(f"{args.pairs} pairs (seed {args.seed}): mean [mean |difference|]; {int(unseen.sum())} pairs whose box "
          "the crop leaves out have no CNR with the seen pixels and are left out of the CNR lines")
    print(f"CNR, frame, every pixel     : {cnr[:, 0].mean():.4f}")
    print(f"CNR, frame, seen pixels     : {cnr[:, 3].mean():.4f}  [{np.abs(cnr[:, 3] - cnr[:, 0]).mean():.4f} "
          "from every pixel]")
    print(f"CNR, native (hi-ml)         : {cnr[:, 6].mean():.4f}  [{np.abs(cnr[:, 6] - cnr[:, 3]).mean():.4f} "
          "from the frame's seen pixels]")
    print(f"Pointing Game, frame/native : {table[:, 1].mean():.4f} / {table[:, 4].mean():.4f}  "
          f"[{np.abs(table[:, 4] - table[:, 1]).mean():.4f} of pairs differ]")
    print(f"Dice@0.5, frame/native      : {table[:, 2].mean():.4f} / {table[:, 5].mean():.4f}  "
          f"[{np.abs(table[:, 5] - table[:, 2]).mean():.4f}]")

if __name__ == "__main__":
    main()
