r"""Every metric XBench reports, once: its key, its labels, its unit and where it appears.

The key is the name in ``metrics.json``, ``per_class.csv``, W&B and the analysis tables; ``short``
heads table columns (console summary, ``summary.md``, the report, the analysis summary) and
``long`` labels figure axes and legends. A metric chosen on the evaluated set itself (the best
threshold τ\*, max-F1) carries a ``*`` in its short label. Every list of metrics elsewhere is a
selection of keys from this table, so a label or a unit changes here and nowhere else.
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from typing import Literal

#: The ranges a metric's value of one pair (and so its means) can take, for ``Metric.bounds``.
FRACTION = (0.0, 1.0)
NON_NEGATIVE = (0.0, math.inf)
CORRELATION = (-1.0, 1.0)
ANY = (-math.inf, math.inf)
#: The MIT benchmark's regularised KL divergence, sum g log(eps + g / (p + eps)), is at least
#: -log(1 + n eps) (eps = 2.2204e-16, n pixels, here up to the largest frame, 4096^2), not 0: a map
#: equal to the gaze scores a hair below 0.
KL_BOUNDS = (-math.log1p(4096**2 * 2.2204e-16), math.inf)

Section = Literal["grounding", "classification", "faithfulness", "sanity", "localisation", "complexity",
                  "randomisation", "robustness", "gaze"]


@dataclass(frozen=True)
class Metric:
    """``unit``: ``percent`` (a fraction, shown x100), ``threshold`` (a τ or probability, shown
    as is), ``ratio`` (shown as is), ``logit`` or ``count``. ``macro``: metrics.json has its macro mean over classes;
    ``per_class``: it has a per-class value; ``analysed``: the bootstrap analysis gives it intervals
    (per class, and as a macro mean where ``macro``). ``bounds``: the closed range its value takes
    by its definition (a reader refuses a value outside it as damage). ``lower_better``: the lower
    value is the better one (a KL divergence, a deletion AUC); tables rank it so and the human gaps
    state their sign by it."""

    key: str
    section: Section
    short: str
    long: str
    unit: Literal["percent", "threshold", "ratio", "logit", "count"] = "percent"
    chosen: bool = False
    macro: bool = True
    per_class: bool = True
    analysed: bool = False
    bounds: tuple[float, float] = FRACTION
    lower_better: bool = False


def _grounding_curves() -> list[Metric]:
    """Dice and IoU (per-image means) and their pooled twins at tau = 0.5, at tau* and tau* itself."""
    out = []
    for key, name, analysed in (("dice", "Dice", True), ("iou", "IoU", True),
                                ("pooled_dice", "pooled Dice", False), ("pooled_iou", "pooled IoU", False)):
        out.append(Metric(f"{key}@0.5", "grounding", f"{name}@0.5", f"{name} at τ = 0.5", analysed=analysed))
    for key, name, analysed in (("dice", "Dice", True), ("iou", "IoU", True),
                                ("pooled_dice", "pooled Dice", False), ("pooled_iou", "pooled IoU", False)):
        out += [
            Metric(f"{key}@best", "grounding", f"{name}@τ*", f"{name} at the best threshold τ*", chosen=True,
                   analysed=analysed),
            Metric(f"{key}@best_tau", "grounding", f"τ* ({name})", f"threshold τ* maximising {name}",
                   unit="threshold", chosen=True, macro=False, analysed=analysed),
        ]
    return out


METRICS: tuple[Metric, ...] = (
    Metric("pairs", "grounding", "Pairs", "graded (image, class) pairs", unit="count",
           macro=False, bounds=NON_NEGATIVE),
    Metric("hits", "grounding", "Hits", "Pointing Game hits", unit="count", macro=False, bounds=NON_NEGATIVE),
    Metric("pointing_game", "grounding", "PG", "Pointing Game", analysed=True),
    *_grounding_curves(),
    Metric("dice@calibrated", "grounding", "Dice@τcal", "Dice at the calibrated threshold τcal", analysed=True),
    Metric("iou@calibrated", "grounding", "IoU@τcal", "IoU at the calibrated threshold τcal", analysed=True),
    Metric("cnr", "grounding", "CNR", "contrast-to-noise ratio", unit="ratio", analysed=True, bounds=ANY),
    Metric("cnr_pairs", "grounding", "CNR pairs", "graded pairs with a defined CNR", unit="count",
           macro=False, bounds=NON_NEGATIVE),
    Metric("constant_maps", "grounding", "Constant maps", "constant maps (a Pointing Game miss)", unit="count",
           macro=False, bounds=NON_NEGATIVE),
    Metric("tied_maxima", "grounding", "Tied maxima", "maps whose maximum is tied", unit="count",
           macro=False, bounds=NON_NEGATIVE),
    Metric("empty_masks", "grounding", "Empty masks", "pairs with an empty region (left out)", unit="count",
           macro=False, bounds=NON_NEGATIVE),
    Metric("positives", "classification", "Pos", "positive images", unit="count", macro=False, bounds=NON_NEGATIVE),
    Metric("negatives", "classification", "Neg", "negative images", unit="count", macro=False, bounds=NON_NEGATIVE),
    Metric("unknown", "classification", "Unknown", "images with an unknown label", unit="count",
           macro=False, bounds=NON_NEGATIVE),
    Metric("auroc", "classification", "AUROC", "AUROC", analysed=True),
    Metric("auprc", "classification", "AUPRC", "AUPRC (average precision)", analysed=True),
    Metric("f1@0.5", "classification", "F1@p≥0.5", "F1 at p ≥ 0.5", analysed=True),
    Metric("accuracy@0.5", "classification", "Acc@p≥0.5", "accuracy at p ≥ 0.5", analysed=True),
    Metric("max_f1", "classification", "max-F1*", "F1 at the best probability threshold", chosen=True,
           analysed=True),
    Metric("max_f1_threshold", "classification", "p* (max-F1)", "probability threshold of max-F1",
           unit="threshold", chosen=True, macro=False),
    Metric("max_f1_logit", "classification", "logit* (max-F1)", "logit threshold of max-F1", unit="logit",
           chosen=True, macro=False, bounds=ANY),
    Metric("accuracy@max_f1", "classification", "Acc@max-F1*", "accuracy at the max-F1 threshold", chosen=True,
           analysed=True),
    # faithfulness (xbench.checks.faithfulness): the class's logit as the map's pixels are removed or inserted
    Metric("deletion_auc", "faithfulness", "Del AUC", "deletion AUC (logit; lower is more faithful)", unit="logit",
           analysed=True, bounds=ANY, lower_better=True),
    Metric("insertion_auc", "faithfulness", "Ins AUC", "insertion AUC (logit; higher is more faithful)",
           unit="logit", analysed=True, bounds=ANY),
    Metric("road_morf", "faithfulness", "ROAD MoRF", "ROAD, most relevant first (logit change)", unit="logit",
           analysed=True, bounds=ANY),
    Metric("road_lerf", "faithfulness", "ROAD LeRF", "ROAD, least relevant first (logit change)", unit="logit",
           analysed=True, bounds=ANY),
    Metric("road", "faithfulness", "ROAD", "ROAD, (LeRF − MoRF) / 2 (logit; higher is more faithful)", unit="logit",
           analysed=True, bounds=ANY),
    # sanity (xbench.checks.sanity): the map after every layer group is randomised, against the original
    Metric("spearman", "sanity", "Spearman", "Spearman correlation with the original map (lower passes)",
           unit="ratio", analysed=True, bounds=CORRELATION, lower_better=True),
    Metric("spearman_abs", "sanity", "Spearman (abs)", "Spearman correlation of absolute values with the original map",
           unit="ratio", analysed=True, bounds=CORRELATION, lower_better=True),
    Metric("ssim", "sanity", "SSIM", "SSIM with the original map (lower passes)", unit="ratio",
           analysed=True, bounds=CORRELATION, lower_better=True),
    # Quantus' families (docs/explanations.md): localisation, complexity and random logit on every graded pair
    # (xbench.metrics.map_quality), robustness on a subset (xbench.checks.robustness)
    Metric("relevance_mass", "localisation", "Mass", "relevance mass accuracy (= attribution localisation)",
           analysed=True),
    Metric("relevance_rank", "localisation", "Rank", "relevance rank accuracy", analysed=True),
    Metric("top_k_intersection", "localisation", "Top-k", "top-k intersection", analysed=True),
    Metric("pixel_auc", "localisation", "Pixel AUC", "pixel AUROC of the map against the region", analysed=True),
    Metric("sparseness", "complexity", "Gini", "sparseness (Gini index; higher is sparser)", unit="ratio",
           analysed=True),
    Metric("complexity", "complexity", "Entropy", "complexity (entropy in nats; lower is simpler)", unit="ratio",
           analysed=True, bounds=NON_NEGATIVE, lower_better=True),
    Metric("random_logit", "randomisation", "Random logit",
           "random logit: SSIM with another class's map (lower passes)", unit="ratio",
           analysed=True, bounds=CORRELATION, lower_better=True),
    Metric("max_sensitivity", "robustness", "Max-sens", "max-sensitivity (lower is more robust)", unit="ratio",
           analysed=True, bounds=NON_NEGATIVE, lower_better=True),
    Metric("local_lipschitz", "robustness", "Lipschitz", "local Lipschitz estimate (lower is more robust)",
           unit="ratio", analysed=True, bounds=NON_NEGATIVE, lower_better=True),
    # gaze (xbench.metrics.gaze): each map against the radiologist's eye-tracking gaze tied to its class
    Metric("nss", "gaze", "NSS", "normalised scanpath saliency (the map's z-score at the fixations)", unit="ratio",
           analysed=True, bounds=ANY),
    Metric("cc", "gaze", "CC", "correlation coefficient of map and gaze density", unit="ratio", analysed=True,
           bounds=CORRELATION),
    Metric("sim", "gaze", "SIM", "similarity (histogram intersection) of map and gaze density", unit="ratio",
           analysed=True),
    Metric("kl_divergence", "gaze", "KL", "KL divergence of the map from the gaze density (lower is better)",
           unit="ratio", analysed=True, bounds=KL_BOUNDS, lower_better=True),
    Metric("auc_judd", "gaze", "AUC-J", "AUC-Judd: fixated against unfixated pixels", unit="ratio", analysed=True),
    Metric("shuffled_auc", "gaze", "sAUC", "shuffled AUC: fixations against other images' fixations", unit="ratio",
           analysed=True),
    Metric("information_gain", "gaze", "IG", "information gain over the centre bias (bits per fixation)",
           unit="ratio", analysed=True, bounds=ANY),
    Metric("ncc", "gaze", "NCC", "normalised cross-correlation with the gaze density (etsaliencymaps)",
           unit="ratio", analysed=True, bounds=CORRELATION),
    Metric("shuffled_ncc", "gaze", "sNCC", "shuffled NCC: NCC with the gaze less NCC with the centre bias",
           unit="ratio", analysed=True, bounds=(-2.0, 2.0)),
)
BY_KEY = {metric.key: metric for metric in METRICS}
#: Metrics the analysis adds (a threshold chosen where it is not scored); not in metrics.json.
ANALYSIS_ONLY = ("dice@calibrated", "iou@calibrated")


def metric(key: str) -> Metric:
    try:
        return BY_KEY[key]
    except KeyError:
        raise KeyError(f"{key!r} is not an XBench metric; known: {', '.join(BY_KEY)}") from None


def short(key: str) -> str:
    return metric(key).short


def long(key: str) -> str:
    return metric(key).long


def run_keys(section: Section, scope: Literal["per_class", "macro"]) -> tuple[str, ...]:
    """The keys of one section of ``metrics.json``, per class or macro, in the table's order."""
    return tuple(m.key for m in METRICS if m.section == section and getattr(m, scope) and m.key not in ANALYSIS_ONLY)


def analysed_keys(section: Section | None = None, macro: bool = False) -> tuple[str, ...]:
    """The keys the analysis gives intervals for (``macro``: only those with a macro mean)."""
    return tuple(m.key for m in METRICS if m.analysed and (section is None or m.section == section)
                 and (m.macro or not macro))


def chosen_keys(section: Section) -> tuple[str, ...]:
    """The keys chosen on the evaluated set itself."""
    return tuple(m.key for m in METRICS if m.chosen and m.section == section)
