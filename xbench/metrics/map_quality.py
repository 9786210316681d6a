"""Quantus' localisation, complexity and random-logit families, on every graded pair of a run.

Each graded (image, class) pair's normalised frame map -- the map Pointing Game, Dice and IoU grade
-- taken as relevance ([`as_relevance`][xbench.geometry.maps.as_relevance]: a constant map is
uniform), against its region ``R`` of ``|R|`` of the frame's ``n`` pixels:

- **relevance mass accuracy** (Arras et al.): the map's mass inside ``R`` over its whole mass, from
  the grounding pass's sums (`xbench.metrics.grounding.counts_and_moments`); Quantus'
  ``AttributionLocalisation`` with its defaults is the same ratio (it adds 1e-9 to the denominator);
- **relevance rank accuracy**: the share of the ``|R|`` most relevant pixels inside ``R``;
- **top-k intersection** (Theiner et al.): the share of the ``k`` most relevant pixels inside ``R``,
  ``k`` = `top_k` (Quantus' 1,000 pixels at 224 x 224, the same share of a larger frame);
- **pixel AUC**: the AUROC of the map's values as a classifier of ``R``'s pixels, from mean ranks
  (exact, ties counting one half; undefined when ``R`` covers the frame);
- **sparseness** (Chalasani et al.): the Gini index of the map, Quantus' formula with its 1e-7 added
  to every value;
- **complexity** (Bhatt et al.): the entropy (nats) of the map's shares of its mass;
- **random logit** (Sixt et al.): the SSIM (`xbench.metrics.sanity.ssim`, the sanity check's) of the
  class's map with the same image's map of another class of the run, drawn as Quantus draws it --
  uniformly among the other classes -- from a generator seeded by the image's index and the class
  (`other_class`): the same draw for every model, whatever the batch; undefined in a one-class run and
  on a frame smaller than SSIM's window.

Equal values at a cut of the top ``|R|`` or top ``k`` share its remaining places: a tie straddling
the cut adds ``places x (tied pixels inside R) / (tied pixels)`` hits, the mean over every order of
the tied pixels. (Quantus breaks such ties by NumPy's unstable sort; the two agree wherever no tie
straddles the cut.) One sort per pair serves ranks, cuts and the Gini index. Every sum over the
frame's pixels is float64, or int64 where it counts (a rank sum reaches 10^9 at 224 x 224, where
float32 keeps 7 digits).
"""

from __future__ import annotations

import torch
from torch import Tensor

from xbench.geometry.maps import as_relevance
from xbench.metrics.sanity import SSIM_TAPS, sorted_mean_ranks, ssim
from xbench.seeds import sample_seed

#: The families' values per pair, by their section of ``metrics.json``, in the tables' order.
SECTIONS = {
    "localisation": ("relevance_mass", "relevance_rank", "top_k_intersection", "pixel_auc"),
    "complexity": ("sparseness", "complexity"),
    "randomisation": ("random_logit",),
}
VALUES = tuple(name for names in SECTIONS.values() for name in names)
#: Top-k's share of the frame: Quantus' default k = 1,000 pixels of a 224 x 224 input.
TOP_K_SHARE = 1000 / 224**2
#: What Quantus' Sparseness adds to every value before its Gini index.
GINI_OFFSET = 1e-7
DEFINITIONS = {
    "localisation": (
        "On each graded pair's normalised frame map (a constant map as uniform): relevance_mass = the map's sum inside "
        "the region over its sum; relevance_rank (top_k_intersection) = the share of the |R| (k) most relevant pixels "
        "inside the region, pixels tied at the cut sharing its places; pixel_auc = AUROC of the map's values for the "
        "region's pixels, ties counting one half."),
    "complexity": (
        "On each graded pair's normalised frame map (a constant map as uniform): sparseness = Gini index of the "
        "values plus 1e-7 (Quantus' Sparseness); complexity = entropy in nats of each pixel's share of the map's sum."),
    "randomisation": (
        "Random logit: SSIM (Gaussian window 11 px, sigma 1.5, data range 1) of each graded pair's normalised frame "
        "map with the same image's map of another class of the run, drawn uniformly from a generator seeded by the "
        "image's index and the class (the same draw for every model)."),
}


def top_k(pixels: int) -> int:
    """Top-k intersection's ``k`` on a frame of ``pixels``: `TOP_K_SHARE` of it, at least one pixel."""
    return max(1, round(pixels * TOP_K_SHARE))


def pair_values(maps: Tensor, regions: Tensor, mass: Tensor, other: Tensor | None, k: int) -> dict[str, Tensor]:
    """The families' values [P] (float64) of P graded pairs.

    Args:
        maps: the pairs' normalised frame maps [P, H, W] in [0, 1] (a constant map all zeros).
        regions: bool [P, H, W].
        mass: float64 [P, 2], the normalised map's sum outside and inside the region (the grounding pass's).
        other: the same images' normalised maps of the drawn other class (`other_class`) [P, H, W], or
            ``None`` (a one-class run: random logit undefined).
        k: top-k intersection's ``k`` (`top_k`).
    """
    count, pixels = maps.shape[0], maps.shape[-2] * maps.shape[-1]
    if count == 0:
        return {name: maps.new_zeros(0, dtype=torch.float64) for name in VALUES}
    relevance = as_relevance(maps).flatten(1)
    constant = relevance.amin(-1) == 1
    region = regions.flatten(1)
    size = region.sum(-1)
    ordered, order = torch.sort(relevance, dim=-1, stable=True)  # ascending
    inside = region.gather(-1, order)
    below = torch.nn.functional.pad(inside.long().cumsum(-1), (1, 0))  # [P, n + 1]: inside pixels before each place
    inside_mass = torch.where(constant, size.double(), mass[:, 1])
    total_mass = torch.where(constant, float(pixels), mass.sum(-1))
    values = {
        "relevance_mass": inside_mass / total_mass,
        "relevance_rank": _top_share(ordered, below, size),
        "top_k_intersection": _top_share(ordered, below, torch.full_like(size, min(k, pixels))),
    }
    values["pixel_auc"] = _pixel_auc(sorted_mean_ranks(ordered), inside, size)
    shifted = ordered.double() + GINI_OFFSET
    weights = 2 * torch.arange(1, pixels + 1, dtype=torch.float64, device=maps.device) - pixels - 1
    values["sparseness"] = (shifted * weights).sum(-1) / (pixels * shifted.sum(-1))
    share = relevance.double() / relevance.double().sum(-1, keepdim=True)
    values["complexity"] = -torch.xlogy(share, share).sum(-1)
    values["random_logit"] = (random_logit(relevance.view_as(maps), as_relevance(other))
                              if other is not None else torch.full((count,), torch.nan, dtype=torch.float64,
                                                                     device=maps.device))
    return values


def _pixel_auc(ranks: Tensor, inside: Tensor, size: Tensor) -> Tensor:
    """float64 [P]: the Mann-Whitney AUROC of the region's pixels, ``(rank sum - |R| (|R| + 1) / 2) /
    (|R| (n - |R|))``, NaN where ``R`` covers the frame. ``ranks``: float64 mean ranks of the sorted
    places [P, n]; ``inside``: whether each sorted place is in the region; ``size``: int64 ``|R|``.
    The least rank sum stays in int64, where it is exact: in float32 (torch's quotient of integers) it
    loses digits past 2**24, 3e-5 of AUC on a region of most of a 224 x 224 frame."""
    outside = ranks.shape[-1] - size
    least = size * (size + 1) // 2  # a product of consecutive integers is even
    rank_sum = (ranks * inside).sum(-1)
    return torch.where(outside > 0, (rank_sum - least) / (size * outside), torch.nan)


def _top_share(ordered: Tensor, below: Tensor, places: Tensor) -> Tensor:
    """float64 [P]: the share of each pair's ``places`` most relevant pixels inside its region, pixels
    tied at the cut sharing its remaining places. ``ordered``: values ascending [P, n]; ``below``:
    inside-region pixels before each sorted place [P, n + 1]."""
    pixels = ordered.shape[-1]
    cut = ordered.gather(-1, (pixels - places).unsqueeze(-1))  # the places-th largest value
    first = torch.searchsorted(ordered, cut, right=False)
    past = torch.searchsorted(ordered, cut, right=True)
    taken = lambda at: below.gather(-1, at).squeeze(-1)  # noqa: E731
    above = pixels - past.squeeze(-1)
    above_inside = below[:, -1] - taken(past)
    tied = (past - first).squeeze(-1)
    tied_inside = taken(past) - taken(first)
    hits = above_inside + (places - above).double() * tied_inside / tied
    return hits / places


def other_class(index: Tensor, cls: Tensor, num_classes: int) -> Tensor:
    """int64 [P]: the other class each pair's random logit compares with, uniform among the run's
    ``num_classes - 1`` other classes, from a generator seeded by ``sample_seed(image index, class)``."""
    draws = [int(torch.randint(num_classes - 1, (), generator=torch.Generator().manual_seed(sample_seed(i, c))))
             for i, c in zip(index.tolist(), cls.tolist())]
    drawn = torch.tensor(draws, dtype=torch.int64, device=cls.device)
    return drawn + (drawn >= cls).long()  # skip the pair's own class


def random_logit(maps: Tensor, other: Tensor) -> Tensor:
    """float64 [P]: the SSIM of each map [P, H, W] with its image's map of the drawn other class
    [P, H, W] (relevance, in [0, 1]); undefined (NaN) on a frame smaller than SSIM's window."""
    if min(maps.shape[-2:]) < SSIM_TAPS:
        return torch.full((maps.shape[0],), torch.nan, dtype=torch.float64, device=maps.device)
    return ssim(maps, other)
