"""Quantus' localisation, complexity and random-logit families (``xbench.metrics.map_quality``), scored
through the run's grounding metric, against Quantus' own classes on the same maps and regions, and
against brute force where Quantus' answer is not one number (a tie at a cut)."""

from __future__ import annotations

import itertools
import math
import warnings

import numpy as np
import pytest
import quantus  # a test-only dependency (the test extra): missing, the test fails rather than skips
import torch
from scipy.ndimage import gaussian_filter
from scipy.stats import entropy

from xbench.geometry.maps import normalise
from xbench.metrics.grounding import GroundingMetrics
from xbench.metrics.map_quality import SECTIONS, TOP_K_SHARE, VALUES, other_class, top_k
from xbench.metrics.sanity import ssim
from xbench.results.payload import map_quality_sections


def scored(saliency: torch.Tensor, masks: torch.Tensor, has_mask: torch.Tensor | None = None,
           batch: int | None = None) -> dict[str, torch.Tensor]:
    """The records of a run's grounding metric over ``saliency`` [B, C, H, W] (normalised), fed
    ``batch`` images at a time."""
    metric = GroundingMetrics(saliency.shape[1], map_quality=True)
    has_mask = torch.ones(saliency.shape[:2], dtype=torch.bool) if has_mask is None else has_mask
    step = batch or saliency.shape[0]
    for start in range(0, saliency.shape[0], step):
        part = slice(start, start + step)
        metric.update(saliency[part], masks[part], has_mask[part], torch.arange(saliency.shape[0])[part])
    return metric.compute()["records"]


def quantus_values(relevance: np.ndarray, regions: np.ndarray) -> dict[str, np.ndarray]:
    """Quantus' own classes on maps [P, H, W] (float64) and regions [P, H, W], each at its defaults
    but for top-k's ``k`` (XBench's share of the frame)."""
    a, s = relevance[:, None].copy(), regions[:, None].astype(np.float64)
    x, y = np.zeros_like(a), np.zeros(len(a), dtype=np.int64)
    k = top_k(relevance[0].size)
    quiet = {"disable_warnings": True}
    metrics = {"relevance_mass": quantus.RelevanceMassAccuracy(**quiet),
               "relevance_rank": quantus.RelevanceRankAccuracy(**quiet),
               "top_k_intersection": quantus.TopKIntersection(k=k, **quiet), "pixel_auc": quantus.AUC(**quiet),
               "attribution_localisation": quantus.AttributionLocalisation(**quiet),
               "sparseness": quantus.Sparseness(**quiet), "complexity": quantus.Complexity(**quiet)}
    out = {}
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")  # numpy's own, where Quantus divides 0 by 0
        for name, metric in metrics.items():
            out[name] = np.asarray(metric(model=None, x_batch=x, y_batch=y, a_batch=a.copy(), s_batch=s,
                                          channel_first=True), dtype=np.float64)
    return out


def random_maps(generator: torch.Generator, shape: tuple[int, ...]) -> torch.Tensor:
    """Normalised maps without ties: smooth blobs plus noise, each min-max normalised."""
    raw = torch.rand(shape, generator=generator, dtype=torch.float64)
    return normalise(raw).float()


def box_masks(generator: torch.Generator, shape: tuple[int, ...]) -> torch.Tensor:
    masks = torch.zeros(shape, dtype=torch.bool)
    height, width = shape[-2:]
    for index in itertools.product(*(range(n) for n in shape[:-2])):
        top, left = (int(torch.randint(0, n - 4, (1,), generator=generator)) for n in (height, width))
        bottom = top + int(torch.randint(2, height - top + 1, (1,), generator=generator))
        right = left + int(torch.randint(2, width - left + 1, (1,), generator=generator))
        masks[index][top:bottom, left:right] = True
    return masks


@pytest.mark.parametrize("side", [32, 57])
def test_localisation_and_complexity_equal_quantus(side):
    """On maps without ties: every value equals Quantus' class; relevance mass (from the grounding
    pass's sums) also equals AttributionLocalisation up to its 1e-9 in the denominator."""
    generator = torch.Generator().manual_seed(side)
    saliency = random_maps(generator, (4, 3, side, side))
    masks = box_masks(generator, saliency.shape)
    records = scored(saliency, masks)
    theirs = quantus_values(saliency.flatten(0, 1).double().numpy(), masks.flatten(0, 1).numpy())
    for name in SECTIONS["localisation"] + SECTIONS["complexity"]:
        np.testing.assert_allclose(records[name].numpy(), theirs[name], rtol=1e-9, atol=1e-12, err_msg=name)
    np.testing.assert_allclose(records["relevance_mass"].numpy(), theirs["attribution_localisation"], rtol=1e-8)


def test_top_k_is_quantus_default_at_224():
    assert top_k(224 * 224) == 1000 and top_k(1) == 1 and top_k(512 * 512) == round(512 * 512 * TOP_K_SHARE)


def brute_force_share(values: np.ndarray, region: np.ndarray, places: int) -> tuple[float, float, float]:
    """Over every order of the pixels tied at the cut: the mean, least and largest share of the
    ``places`` most relevant pixels inside the region."""
    cut = np.sort(values)[::-1][places - 1]
    above, tied = np.flatnonzero(values > cut), np.flatnonzero(values == cut)
    shares = [region[np.concatenate([above, order])[:places]].mean() for order in itertools.permutations(tied)]
    return float(np.mean(shares)), min(shares), max(shares)


def test_ties_at_the_cut_share_its_places():
    """A tie straddling the cut: the share is the mean over every order of the tied pixels (brute
    force), and Quantus' answer (one order, NumPy's) is one of those orders'. Ties elsewhere change
    nothing: there XBench equals Quantus."""
    values = np.array([[0.0, 1.0, 0.5, 0.5, 0.5, 0.5, 0.2, 0.5, 0.1]], dtype=np.float32).reshape(1, 1, 3, 3)
    region = np.array([[1, 1, 1, 0, 0, 1, 0, 0, 0]], dtype=bool).reshape(1, 1, 3, 3)
    records = scored(torch.from_numpy(values), torch.from_numpy(region))
    flat_values, flat_region = values.reshape(-1), region.reshape(-1)
    expected, low, high = brute_force_share(flat_values, flat_region, int(flat_region.sum()))  # |R| = 4: cut in 0.5s
    assert records["relevance_rank"].item() == pytest.approx(expected, abs=1e-12)
    theirs = quantus_values(values[0].astype(np.float64), region[0])["relevance_rank"][0]
    assert low <= theirs <= high and low < high
    # k = 1 (the frame's share of 9 pixels): the single maximum, no tie at the cut
    assert records["top_k_intersection"].item() == quantus_values(values[0].astype(np.float64),
                                                                  region[0])["top_k_intersection"][0] == 1.0


def test_constant_maps_are_uniform_relevance():
    """A constant map (all zeros after normalisation) is uniform relevance: Quantus' classes on a
    constant map (which their normalisation by the maximum makes all ones) agree -- in a batch with
    a map that is not constant, as Quantus refuses a batch of constant maps -- and every pixel
    tied, rank and top-k give the region's share of the frame."""
    generator = torch.Generator().manual_seed(2)
    masks = torch.zeros(1, 2, 16, 16, dtype=torch.bool)
    masks[0, 0, 2:7, 3:12] = True
    masks[0, 1, 8:16, 0:4] = True
    saliency = torch.zeros(1, 2, 16, 16)
    saliency[0, 1] = random_maps(generator, (1, 1, 16, 16))[0, 0]
    records = scored(saliency, masks)
    maps = saliency[0].double().numpy().copy()
    maps[0] = 0.3
    theirs = quantus_values(maps, masks[0].numpy())
    for name in SECTIONS["localisation"] + SECTIONS["complexity"]:
        np.testing.assert_allclose(records[name].numpy()[1:], theirs[name][1:], rtol=1e-9, atol=1e-12, err_msg=name)
    for name in ("relevance_mass", "pixel_auc", "sparseness", "complexity"):
        assert records[name][0].item() == pytest.approx(theirs[name][0], rel=1e-9, abs=1e-12), name
    share = masks[0, 0].double().mean().item()
    assert records["relevance_rank"][0].item() == records["top_k_intersection"][0].item() == pytest.approx(share)
    assert records["complexity"][0].item() == pytest.approx(math.log(256))
    assert records["pixel_auc"][0].item() == 0.5 and abs(records["sparseness"][0].item()) < 1e-12


@pytest.mark.parametrize("left_out", [4, 1, 224 * 224 - 1])
def test_regions_of_most_of_a_frame_equal_quantus_to_1e_12(left_out):
    """Regions of all but ``left_out`` pixels of a 224 x 224 frame (n - 4, n - 1 and a single pixel),
    scattered, on a map and on a constant map (uniform relevance): the sums over the frame's pixels
    -- pixel AUC's rank sums, the mass, the Gini index, the entropy -- are float64, so each equals
    Quantus' value to 1e-12 (pixel AUC's least rank sum in float32 was 3e-5 off at n - 4, and the
    constant map's AUC 0.4999999933). The entropy is exact: Quantus' adds 1e-12 to every share in
    its logarithm, which takes up to n x 1e-12 off."""
    generator = torch.Generator().manual_seed(left_out)
    pixels = 224 * 224
    saliency = torch.cat([random_maps(generator, (1, 1, 224, 224)), torch.zeros(1, 1, 224, 224)], 1)
    masks = torch.zeros(1, 2, pixels, dtype=torch.bool)
    masks[..., torch.randperm(pixels, generator=generator)[: pixels - left_out]] = True
    masks = masks.view(saliency.shape)
    records = scored(saliency, masks)
    relevance = torch.where(saliency.flatten(2).amax(-1)[..., None, None] == 0, 1.0, saliency)
    theirs = quantus_values(relevance[0].double().numpy(), masks[0].numpy())
    for name in ("pixel_auc", "relevance_mass", "sparseness"):
        np.testing.assert_allclose(records[name].numpy(), theirs[name], rtol=0, atol=1e-12, err_msg=name)
    np.testing.assert_allclose(records["complexity"].numpy(), theirs["complexity"], rtol=0, atol=pixels * 1e-12)
    shares = relevance[0].flatten(1).double().numpy()
    np.testing.assert_allclose(records["complexity"].numpy(), entropy(shares, axis=1), rtol=0, atol=1e-12)
    assert records["pixel_auc"][1].item() == 0.5 and records["complexity"][1].item() == pytest.approx(
        math.log(pixels), abs=1e-12)


def test_region_covering_the_frame_has_no_pixel_auc_and_empty_regions_are_not_scored():
    """A region of every pixel leaves no outside pixel (AUC undefined, counted); a pair with an
    empty region is not graded (counted by grounding), so none of its values exists."""
    generator = torch.Generator().manual_seed(3)
    saliency = random_maps(generator, (2, 2, 12, 12))
    masks = torch.zeros(saliency.shape, dtype=torch.bool)
    masks[0, 0] = True
    masks[0, 1, 3:5, 3:5] = True
    masks[1, 0, 1:4, 1:9] = True  # image 1, class 1: empty region
    records = scored(saliency, masks)
    assert records["index"].tolist() == [0, 0, 1] and records["class"].tolist() == [0, 1, 0]
    assert math.isnan(records["pixel_auc"][0]) and not records["pixel_auc"][1:].isnan().any()
    assert records["relevance_mass"][0] == 1.0 and records["relevance_rank"][0] == 1.0
    body, _ = map_quality_sections(records, ["a", "b"], 144)["localisation"]
    assert body["undefined"]["pixel_auc"] == 1 and body["pairs"] == 3 and body["images"] == 2
    assert body["per_class"]["a"]["pairs"] == 2 and body["top_k"] == top_k(144)


def test_values_do_not_depend_on_the_batch():
    generator = torch.Generator().manual_seed(11)
    saliency = random_maps(generator, (5, 3, 20, 20))
    masks = box_masks(generator, saliency.shape)
    whole, single = scored(saliency, masks), scored(saliency, masks, batch=1)
    for name in VALUES:
        assert torch.equal(whole[name], single[name]), name


def mirror_ssim(a: np.ndarray, b: np.ndarray) -> float:
    """SSIM written from its definition with SciPy's Gaussian filter (sigma 1.5, radius 5, the
    border mirrored), averaged over every pixel: the similarity XBench's SSIM computes."""
    blur = lambda v: gaussian_filter(v, 1.5, truncate=5 / 1.5, mode="mirror")  # noqa: E731
    mean_a, mean_b = blur(a), blur(b)
    var_a, var_b = blur(a * a) - mean_a**2, blur(b * b) - mean_b**2
    covariance = blur(a * b) - mean_a * mean_b
    c1, c2 = 0.01**2, 0.03**2
    return float(np.mean((2 * mean_a * mean_b + c1) * (2 * covariance + c2)
                         / ((mean_a**2 + mean_b**2 + c1) * (var_a + var_b + c2))))


@pytest.mark.parametrize("classes", [2, 4])
def test_random_logit_equals_quantus(classes):
    """Quantus' RandomLogit, given the run's maps as its explanations and the SSIM written from its
    definition (its default compares the maps flattened to one row): for each class it draws, its
    value is XBench's SSIM with that class's map; XBench's own draw (seeded by image and class) scores
    each pair the same way, and with two classes -- one possible draw -- equals Quantus' value."""
    generator = torch.Generator().manual_seed(classes)
    saliency = random_maps(generator, (3, classes, 24, 24))
    saliency[1, 0] = 0.0  # a constant map: uniform relevance
    masks = box_masks(generator, saliency.shape)
    records = scored(saliency, masks)
    relevance = torch.where((saliency.flatten(2).amax(-1) == 0)[..., None, None], 1.0, saliency).double()
    asked = []

    def explain(model, inputs, targets, **kwargs):
        asked.append(np.asarray(targets).copy())
        rows = np.asarray(inputs)[:, 0, 0, 0].astype(int)  # each input carries its image's row
        return relevance.numpy()[rows, np.asarray(targets)][:, None]

    def similarity(a, b, batched=True, **kwargs):
        return [mirror_ssim(x.reshape(24, 24), y.reshape(24, 24)) for x, y in zip(a, b)]

    inputs = np.broadcast_to(np.arange(3, dtype=np.float64)[:, None, None, None], (3, 1, 24, 24)).copy()
    theirs = {}
    for seed in range(4):
        for c in range(classes):
            metric = quantus.RandomLogit(num_classes=classes, seed=seed, similarity_func=similarity, normalise=False,
                                         disable_warnings=True)
            asked.clear()
            with warnings.catch_warnings():
                warnings.simplefilter("ignore")
                values = metric(model=torch.nn.Identity(), x_batch=inputs, y_batch=np.full(3, c),
                                a_batch=relevance[:, c, None].numpy(), explain_func=explain, channel_first=True)
            other = asked[-1]
            assert (other != c).all()
            ours = ssim(relevance[:, c], relevance[torch.arange(3), torch.from_numpy(other)]).numpy()
            np.testing.assert_allclose(ours, values, rtol=1e-7, atol=1e-9)
            theirs.update({(image, c, int(o)): v for image, (o, v) in enumerate(zip(other, values))})
    drawn = other_class(records["index"], records["class"], classes)
    for row, (image, c, o) in enumerate(zip(records["index"].tolist(), records["class"].tolist(), drawn.tolist())):
        expected = mirror_ssim(relevance[image, c].numpy(), relevance[image, o].numpy())
        assert records["random_logit"][row].item() == pytest.approx(expected, rel=1e-7, abs=1e-9)
        if classes == 2:
            assert records["random_logit"][row].item() == pytest.approx(theirs[(image, c, o)], rel=1e-7, abs=1e-9)


def test_the_other_class_is_drawn_uniformly_and_per_pair():
    """The draw never takes the pair's own class, takes each other class about equally often, and
    depends only on the image's index and the class (so on no batch, and on no model)."""
    index = torch.arange(3000).repeat_interleave(5)
    cls = torch.arange(5).repeat(3000)
    drawn = other_class(index, cls, 5)
    assert not (drawn == cls).any()
    counts = torch.bincount(drawn[cls == 2], minlength=5)
    # 3000 draws over 4 classes: each count is Binomial(3000, 1/4), sd 23.7; 6 sd either side
    assert counts[2] == 0 and ((counts[[0, 1, 3, 4]] - 750).abs() < 6 * 23.72).all(), counts
    assert torch.equal(other_class(index[7:9], cls[7:9], 5), drawn[7:9])


def test_one_class_run_has_no_random_logit():
    generator = torch.Generator().manual_seed(5)
    saliency = random_maps(generator, (2, 1, 10, 10))
    records = scored(saliency, box_masks(generator, saliency.shape))
    assert records["random_logit"].isnan().all()
    found = map_quality_sections(records, ["pneumonia"], 100)
    assert found["randomisation"] == ({"applicable": False,
                                       "reason": "the run has one class: there is no other class's map"}, {})
    assert found["localisation"][0]["applicable"] and found["complexity"][0]["macro"]["sparseness"] is not None


def test_a_batch_without_graded_pairs_adds_no_row():
    saliency = torch.rand(2, 3, 8, 8)
    records = scored(normalise(saliency), torch.zeros(2, 3, 8, 8, dtype=torch.bool))
    assert all(records[name].numel() == 0 for name in VALUES)


def test_a_frame_smaller_than_the_ssim_window_has_no_random_logit():
    generator = torch.Generator().manual_seed(9)
    saliency = random_maps(generator, (2, 3, 10, 10))
    records = scored(saliency, box_masks(generator, saliency.shape))
    assert records["random_logit"].isnan().all() and not records["pixel_auc"].isnan().any()
    body, _ = map_quality_sections(records, ["a", "b", "c"], 100)["randomisation"]
    assert body["undefined"]["random_logit"] == body["pairs"] > 0 and body["macro"]["random_logit"] is None


@pytest.mark.parametrize("shape", [(11, 11), (40, 57), (224, 224)])
def test_ssim_equals_torchmetrics(shape):
    """XBench's SSIM (the window as two matrix products) is torchmetrics' SSIM: Gaussian window of 11
    pixels, sigma 1.5, data range 1, the border mirrored, the mean over every pixel."""
    from torchmetrics.functional.image import structural_similarity_index_measure

    generator = torch.Generator().manual_seed(shape[1])
    a = torch.rand(3, *shape, generator=generator, dtype=torch.float64)
    b = torch.cat([a[:1], torch.rand(2, *shape, generator=generator, dtype=torch.float64)])
    b[2] = (a[2] + b[2]) / 2
    theirs = structural_similarity_index_measure(a.unsqueeze(1), b.unsqueeze(1), data_range=1.0, reduction="none")
    torch.testing.assert_close(ssim(a, b), theirs, rtol=1e-12, atol=1e-12)
