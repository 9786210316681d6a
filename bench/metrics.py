"""Cost of the 101-threshold grounding update relative to a single-threshold Dice.

    python bench/metrics.py [--device cuda] [--repeats 5] [--threads 1] [--chexlocalize-repo PATH] [--quick]

Prints, from one run: the update time for B=64, C=14, 224x224 maps at 101 thresholds (Pointing
Game, Dice and IoU curves, CNR and the records: ``GroundingMetrics.update``) with its parts, a
plain vectorised Dice at tau = 0.5 on the same tensors, and a brute-force loop that thresholds the
batch 101 times, with the two ratios docs/performance.md reports. The parts are timed on the same tensors
and told apart by difference: the counts (``threshold_counts``, the histogram pass), CNR (its sums
in that pass, ``counts_and_moments`` less the counts), Pointing Game with the Dice and IoU curves
(``grounding_records`` less ``counts_and_moments``) and the records (the update less
``grounding_records``: class sums and record states). Then, at native size (one 320x320 map of a
2320x2828 radiograph, as cheXlocalize's Grad-CAM): XBench's whole evaluation of the pair at 101
thresholds (bilinear upsampling, min-max, the counts, Dice and IoU curves) beside cheXlocalize's
single threshold on the same map (upsampling, their ``cam_to_segmentation`` and
``calculate_iou``, imported from ``--chexlocalize-repo``; without it, the same steps written
plainly in torch and NumPy), and their ratio. ``--quick`` (B = 8, neither the loop nor the native
comparison) takes seconds: the test suite runs it to print the update's cost in its log.

Then Quantus' localisation, complexity and random-logit families (``GroundingMetrics`` with
``map_quality``, what every run's grounding does) on one graded pair per image, as a multi-label
dataset has a few: the update with them against the same update without, per graded pair.

Last, the gaze metrics (``GazeMetrics.update``: NSS, CC, SIM, KL, AUC-Judd, shuffled AUC, IG, NCC
and sNCC of every pair with gaze) on the same maps with two gaze pairs per image, as a REFLACX
reading dictates a few findings, beside the grounding update of the same batch: per pair and in all.
"""

from __future__ import annotations

import argparse
import sys
from pathlib import Path

import numpy as np
import torch
import torch.nn.functional as F

from xbench.metrics import THRESHOLDS, GroundingMetrics, grounding_records
from xbench.metrics.gaze import GazeMetrics
from xbench.metrics.grounding import counts_and_moments, pair_scores, threshold_counts
from xbench.metrics.native import native_upsample
from xbench.geometry.maps import normalise
from timing import best_seconds, best_seconds_each

NATIVE_MAP, NATIVE_IMAGE = (320, 320), (2320, 2828)


def single_tau_dice(s: torch.Tensor, m: torch.Tensor, tau: float) -> tuple[torch.Tensor, torch.Tensor]:
    """The plain way: threshold, intersect, count per (image, class); Dice and IoU."""
    pred = (s >= tau).flatten(2)
    region = m.flatten(2)
    inter = (pred & region).sum(-1, dtype=torch.int32)
    total = pred.sum(-1, dtype=torch.int32) + region.sum(-1, dtype=torch.int32)
    return 2 * inter / total, inter / (total - inter)


def loop_101(s: torch.Tensor, m: torch.Tensor) -> list:
    return [single_tau_dice(s, m, float(tau)) for tau in THRESHOLDS]


def xbench_native(raw_map: torch.Tensor, mask: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """XBench's whole evaluation of one pair at native size, at all 101 thresholds."""
    saliency = normalise(native_upsample(raw_map, tuple(mask.shape))[None, None])
    return pair_scores(*threshold_counts(saliency, mask[None, None]))


def single_threshold_native(repo: Path | None):
    """cheXlocalize's single-threshold evaluation of one pair: their code from ``repo``, or the same
    steps written plainly (upsample, (x - min) / max, > 0.5, IoU in NumPy)."""
    if repo is not None:
        sys.path.insert(0, str(repo))
        from eval import calculate_iou  # noqa: PLC0415 (their code, from the given clone)
        from heatmap_to_segmentation import cam_to_segmentation  # noqa: PLC0415

        def theirs(raw_map, mask):
            upsampled = F.interpolate(raw_map[None, None], size=tuple(mask.shape), mode="bilinear", align_corners=False)
            return calculate_iou(cam_to_segmentation(upsampled, threshold=0.5), mask, true_pos_only=False)
        return theirs

    def plain(raw_map, mask):
        x = F.interpolate(raw_map[None, None], size=tuple(mask.shape), mode="bilinear", align_corners=False)
        x = x - x.min()
        segmentation = (x.div(x.max()) > 0.5).numpy()[0, 0]
        return np.logical_and(segmentation, mask).sum() / np.logical_or(segmentation, mask).sum()
    return plain


def native_comparison(repo: Path | None, repeats: int) -> None:
    gen = torch.Generator().manual_seed(0)
    raw_map = F.avg_pool2d(torch.rand(1, 1, *NATIVE_MAP, generator=gen), 9, stride=1, padding=4)[0, 0]
    mask = torch.zeros(NATIVE_IMAGE, dtype=torch.bool)
    mask[600:1700, 500:1900] = True
    theirs = single_threshold_native(repo)
    mask_numpy = mask.numpy()
    times = best_seconds_each({"xbench": lambda: xbench_native(raw_map, mask),
                               "theirs": lambda: theirs(raw_map, mask_numpy)}, torch.device("cpu"), repeats)
    t_xbench, t_theirs = times["xbench"], times["theirs"]
    source = f"their code from {repo}" if repo else "written plainly; --chexlocalize-repo runs theirs"
    print(f"native {NATIVE_MAP[0]}x{NATIVE_MAP[1]} map on a {NATIVE_IMAGE[0]}x{NATIVE_IMAGE[1]} image, one pair:")
    print(f"XBench, 101 thresholds        : {t_xbench * 1e3:9.1f} ms")
    print(f"cheXlocalize, one threshold   : {t_theirs * 1e3:9.1f} ms   ({source})")
    print(f"native ratio                  : {t_xbench / t_theirs:9.2f}x   (target <= 1.5)")


def map_quality_cost(s: torch.Tensor, m: torch.Tensor, index: torch.Tensor, classes: int, device: torch.device,
                     repeats: int) -> None:
    """The update with and without Quantus' families, one graded pair (class 0) per image."""
    one_each = torch.zeros(s.shape[:2], dtype=torch.bool, device=device)
    one_each[:, 0] = True
    plain = GroundingMetrics(classes, validate_args=False).to(device)
    families = GroundingMetrics(classes, validate_args=False, map_quality=True).to(device)
    times = best_seconds_each({"plain": lambda: plain.update(s, m, one_each, index),
                               "families": lambda: families.update(s, m, one_each, index)}, device, repeats)
    extra = times["families"] - times["plain"]
    print(f"Quantus' families, {s.shape[0]} graded pairs of {classes}-class maps (one per image):")
    print(f"  update without     : {times['plain'] * 1e3:9.1f} ms")
    print(f"  update with        : {times['families'] * 1e3:9.1f} ms   ({times['families'] / times['plain']:.2f}x)")
    print(f"  per graded pair    : {extra / s.shape[0] * 1e3:9.2f} ms   (a sort and an SSIM)")


def gaze_cost(s: torch.Tensor, m: torch.Tensor, index: torch.Tensor, classes: int, device: torch.device,
              repeats: int) -> None:
    """The gaze update on two pairs per image beside the grounding update of every pair of the batch."""
    batch, _, height, width = s.shape
    gen = torch.Generator(device=device).manual_seed(1)
    fixations = (torch.rand(s.shape, generator=gen, device=device) < 2e-4).float()
    gaze = torch.rand(s.shape, generator=gen, device=device)
    gaze /= gaze.flatten(2).sum(-1)[..., None, None]
    has_gaze = torch.zeros(s.shape[:2], dtype=torch.bool, device=device)
    has_gaze[:, :2] = True
    shuffled = (torch.rand(batch, height, width, generator=gen, device=device) < 2e-3).float()
    baseline = torch.rand(height, width, generator=gen, device=device)
    grounding = GroundingMetrics(classes, validate_args=False, map_quality=True).to(device)
    metric = GazeMetrics(classes, baseline).to(device)
    every = torch.ones(s.shape[:2], dtype=torch.bool, device=device)
    times = best_seconds_each({"grounding": lambda: grounding.update(s, m, every, index),
                               "gaze": lambda: metric.update(s, gaze, fixations, has_gaze, shuffled, index)},
                              device, repeats)
    pairs, graded = int(has_gaze.sum()), s.shape[0] * s.shape[1]
    per_gaze, per_graded = times["gaze"] / pairs, times["grounding"] / graded
    print(f"gaze metrics, {pairs} pairs with gaze ({batch} images x 2) beside the grounding of {graded} pairs:")
    print(f"  grounding update   : {times['grounding'] * 1e3:9.1f} ms   (map_quality, as a run)")
    print(f"  gaze update        : {times['gaze'] * 1e3:9.1f} ms   ({times['gaze'] / times['grounding']:.2f}x the "
          "grounding update)")
    print(f"  per pair           : {per_gaze * 1e3:9.2f} ms   ({per_gaze / per_graded:.2f}x a graded pair's)")


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--device", default="cpu")
    parser.add_argument("--repeats", type=int, default=5)
    parser.add_argument("--batch", type=int, default=64)
    parser.add_argument("--classes", type=int, default=14)
    parser.add_argument("--size", type=int, default=224)
    parser.add_argument("--threads", type=int, help="CPU threads (default: torch's)")
    parser.add_argument("--chexlocalize-repo", type=Path, help="a clone of rajpurkarlab/cheXlocalize")
    parser.add_argument("--quick", action="store_true", help="B = 8, no loop, no native comparison: seconds")
    args = parser.parse_args(argv)
    if args.quick:
        args.batch = 8
    if args.threads:
        torch.set_num_threads(args.threads)
    device = torch.device(args.device)
    gen = torch.Generator(device=device).manual_seed(0)
    shape = (args.batch, args.classes, args.size, args.size)
    s = torch.rand(shape, generator=gen, device=device)
    s.flatten(2)[..., 0] = 0.0
    s.flatten(2)[..., 1] = 1.0
    m = torch.rand(shape, generator=gen, device=device) > 0.7
    has = torch.ones(shape[:2], dtype=torch.bool, device=device)
    index = torch.arange(args.batch, device=device)
    seen = torch.zeros(args.batch, args.size, args.size, dtype=torch.bool, device=device)
    seen[:, :, args.size // 8 : -args.size // 8] = True  # a centre crop of a landscape image: CNR's seen pixels

    metric = GroundingMetrics(args.classes, validate_args=False).to(device)
    # The update's parts are nested prefixes of it, timed in turn with it and the single-tau Dice.
    parts = best_seconds_each({
        "update": lambda: metric.update(s, m, has, index),
        "update, window": lambda: metric.update(s, m, has, index, seen=seen),
        "counts": lambda: threshold_counts(s, m),
        "counts+CNR": lambda: counts_and_moments(s, m),
        "records": lambda: grounding_records(s, m, has),
        "single": lambda: single_tau_dice(s, m, 0.5),
    }, device, args.repeats)
    t_metric, t_single = parts["update"], parts["single"]
    t_loop = None if args.quick else best_seconds(lambda: loop_101(s, m), device, 1)
    print(f"device: {device} ({torch.get_num_threads()} CPU threads), maps {list(shape)}")
    print(f"101-threshold update : {t_metric * 1e3:9.1f} ms   (GroundingMetrics.update, CNR and records included)")
    for label, value in (
        ("counts", parts["counts"]),
        ("CNR", parts["counts+CNR"] - parts["counts"]),
        ("Pointing Game, Dice/IoU", parts["records"] - parts["counts+CNR"]),
        ("records", t_metric - parts["records"]),
    ):
        print(f"  {label:23s}: {value * 1e3:9.1f} ms")
    print(f"  with a window      : {parts['update, window'] * 1e3:9.1f} ms   (a model's crop: CNR on the seen pixels)")
    print(f"single-tau Dice      : {t_single * 1e3:9.1f} ms")
    if t_loop is not None:
        print(f"101x threshold loop  : {t_loop * 1e3:9.1f} ms")
    print(f"update / single-tau  : {t_metric / t_single:9.2f}x   (target <= 1.0 on CPU, <= 1.5 on CUDA)")
    print(f"  with a window      : {parts['update, window'] / t_single:9.2f}x")
    map_quality_cost(s, m, index, args.classes, device, args.repeats)
    gaze_cost(s, m, index, args.classes, device, args.repeats)
    if t_loop is None:
        print("loop / update        :   skipped   (--quick)")
        return
    print(f"loop / update        : {t_loop / t_metric:9.1f}x   (target >= 50)")
    native_comparison(args.chexlocalize_repo, args.repeats)


if __name__ == "__main__":
    main()
