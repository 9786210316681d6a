"""GroundingMetrics against an independent brute-force loop over all 101 thresholds."""

import os
import subprocess
import sys

import numpy as np
import pytest
import torch
from hypothesis import given, settings
from hypothesis import strategies as st

from xbench.metrics import GroundingMetrics, THRESHOLDS, grounding, grounding_records, threshold_counts

from conftest import SUBPROCESS_SAFETY_TIMEOUT

TAUS = [np.float32(k / 100) for k in range(101)]
EDGE_VALUES = np.array([0.29, 0.5, 1.0, 0.0, 0.01, 0.53, 0.09, 0.33, 0.99], dtype=np.float32)


def reference_cnr(smap, region, seen=None):
    """CNR with numpy's mean and (population) variance over the ``seen`` pixels (default all);
    None where it is undefined: no seen pixel inside or outside the region, or no noise with a
    contrast (an infinite ratio)."""
    smap = smap.astype(np.float64)
    seen = np.ones_like(region) if seen is None else seen
    inside, outside = smap[region & seen], smap[~region & seen]
    if not inside.size or not outside.size:
        return None
    contrast = abs(inside.mean() - outside.mean())
    noise = np.sqrt(np.var(inside) + np.var(outside))
    if noise == 0:
        return 0.0 if contrast == 0 else None
    return contrast / noise


def reference(s, m, has, pair_class=None, num_classes=None, seen=None):
    """Brute force: a Python loop per image, pair and threshold with ``>=``; pair ``(b, k)`` counts
    under class ``pair_class[b, k]`` (default ``k``); CNR over the pixels ``seen[b]`` (default all)."""
    B, K = s.shape[:2]
    C = K if num_classes is None else num_classes
    out = {k: np.zeros(C, dtype=np.int64) for k in ("pairs", "hits", "const", "tied", "empty", "region", "cnr_pairs")}
    out.update({k: np.zeros((C, 101)) for k in ("dice", "iou")})
    out.update({k: np.zeros((C, 101), dtype=np.int64) for k in ("pred", "inter")})
    out["cnr"] = np.zeros(C)
    rows = []
    for b in range(B):
        for k in range(K):
            if not has[b, k]:
                continue
            c = k if pair_class is None else pair_class[b, k]
            region = m[b, k]
            if region.sum() == 0:
                out["empty"][c] += 1
                continue
            smap = s[b, k]
            cnr = reference_cnr(smap, region, None if seen is None else seen[b])
            if cnr is not None:
                out["cnr_pairs"][c] += 1
                out["cnr"][c] += cnr
            peak = smap.max()
            constant = bool((smap == smap.flat[0]).all())
            at_peak = smap == peak
            hit = (not constant) and bool(at_peak[region].any())
            out["pairs"][c] += 1
            out["hits"][c] += hit
            out["const"][c] += constant
            out["tied"][c] += (not constant) and at_peak.sum() > 1
            out["region"][c] += region.sum()
            preds, inters = [], []
            for k, tau in enumerate(TAUS):
                predicted = smap >= tau
                inter = int((predicted & region).sum())
                pred = int(predicted.sum())
                union = int((predicted | region).sum())
                out["dice"][c, k] += 2 * inter / (pred + region.sum())
                out["iou"][c, k] += inter / union
                out["pred"][c, k] += pred
                out["inter"][c, k] += inter
                preds.append(pred)
                inters.append(inter)
            rows.append((b, c, int(region.sum()), hit, preds, inters, np.nan if cnr is None else cnr))
    return out, rows


def make_batch(rng, B, C, H, W, p_mask=0.8, edge_fraction=0.2):
    """Normalised maps (max exactly 1, or all zeros) with bin-edge values, masks of all kinds."""
    s = rng.random((B, C, H, W), dtype=np.float32)
    edges = rng.random((B, C, H, W)) < edge_fraction
    s[edges] = rng.choice(EDGE_VALUES, size=int(edges.sum()))
    # exact neighbours of thresholds
    near = rng.random((B, C, H, W)) < 0.05
    picks = rng.integers(0, 101, size=int(near.sum()))
    s[near] = np.nextafter(np.array(TAUS, dtype=np.float32)[picks], np.float32(rng.choice([-1, 2])))
    s = np.clip(s, 0, 1).astype(np.float32)
    flat = s.reshape(B, C, -1)
    for b in range(B):
        for c in range(C):
            kind = rng.integers(0, 6)
            if kind == 0 or H * W == 1:
                flat[b, c] = 0  # constant map
            else:  # min-max normalised: minimum exactly 0, maximum exactly 1
                low, high = rng.choice(H * W, size=2, replace=False)
                flat[b, c, low], flat[b, c, high] = 0.0, 1.0
                if kind == 1:  # several pixels at the maximum
                    ties = rng.integers(0, H * W, size=3)
                    flat[b, c, ties[ties != low]] = 1.0
    m = np.zeros((B, C, H, W), dtype=bool)
    for b in range(B):
        for c in range(C):
            kind = rng.integers(0, 5)
            if kind == 0:
                m[b, c, rng.integers(0, H), rng.integers(0, W)] = True  # single pixel
            elif kind == 1:
                m[b, c] = True  # full image
            elif kind == 2:
                pass  # empty
            else:
                y0, x0 = rng.integers(0, H), rng.integers(0, W)
                m[b, c, y0 : y0 + rng.integers(1, H + 1), x0 : x0 + rng.integers(1, W + 1)] = True
    has = rng.random((B, C)) < p_mask
    return s, m, has


def run_metric(batches, num_classes, seen=None):
    metric = GroundingMetrics(num_classes)
    for s, m, has, index in batches:
        metric.update(torch.from_numpy(s), torch.from_numpy(m), torch.from_numpy(has), torch.as_tensor(index),
                      seen=None if seen is None else torch.from_numpy(seen[index]))
    return metric.compute()


def check_against_reference(result, ref):
    assert torch.equal(result["pairs"], torch.from_numpy(ref["pairs"]))
    assert torch.equal(result["hits"], torch.from_numpy(ref["hits"]))
    assert torch.equal(result["constant_maps"], torch.from_numpy(ref["const"]))
    assert torch.equal(result["tied_maxima"], torch.from_numpy(ref["tied"]))
    assert torch.equal(result["empty_masks"], torch.from_numpy(ref["empty"]))
    assert torch.equal(result["cnr_pairs"], torch.from_numpy(ref["cnr_pairs"]))
    with np.errstate(invalid="ignore", divide="ignore"):
        np.testing.assert_allclose(result["cnr"].numpy(), ref["cnr"] / ref["cnr_pairs"], rtol=1e-9, atol=1e-9)
    pairs = ref["pairs"][:, None]
    with np.errstate(invalid="ignore", divide="ignore"):
        dice = ref["dice"] / pairs
        iou = ref["iou"] / pairs
        pooled_dice = 2 * ref["inter"] / (ref["pred"] + ref["region"][:, None])
        pooled_iou = ref["inter"] / (ref["pred"] + ref["region"][:, None] - ref["inter"])
    np.testing.assert_allclose(result["dice_curve"].numpy(), dice, rtol=0, atol=1e-9)
    np.testing.assert_allclose(result["iou_curve"].numpy(), iou, rtol=0, atol=1e-9)
    np.testing.assert_allclose(result["pooled_dice_curve"].numpy(), pooled_dice, rtol=0, atol=1e-12)
    np.testing.assert_allclose(result["pooled_iou_curve"].numpy(), pooled_iou, rtol=0, atol=1e-12)
    for name, curve in (("dice", dice), ("iou", iou)):
        for c in range(curve.shape[0]):
            if ref["pairs"][c] == 0:
                assert np.isnan(result[f"{name}@best"][c].item())
                continue
            best_k = int(np.argmax(curve[c]))
            assert result[f"{name}@best"][c].item() == pytest.approx(curve[c, best_k], abs=1e-9)
            assert result[f"{name}@best_tau"][c].item() == pytest.approx(float(TAUS[best_k]))
            assert result[f"{name}@0.5"][c].item() == pytest.approx(curve[c, 50], abs=1e-9)


def test_bins_equal_bucketize_bit_for_bit():
    rng = np.random.default_rng(0)
    values = [rng.random(20000, dtype=np.float32)]
    for tau in TAUS:  # every threshold and its float32 neighbours
        below = above = tau
        values.append(np.array([tau]))
        for _ in range(50):
            below = np.nextafter(below, np.float32(-1))
            above = np.nextafter(above, np.float32(2))
            values.append(np.array([below, above], dtype=np.float32))
    s = np.clip(np.concatenate(values).astype(np.float32), 0, 1)
    s = torch.from_numpy(s).view(1, 1, 1, -1)
    inside = torch.zeros_like(s, dtype=torch.bool)
    predicted, _ = threshold_counts(s, inside)
    bins = torch.bucketize(s.flatten(), THRESHOLDS, right=True) - 1
    expected = torch.bincount(bins, minlength=101).flip(0).cumsum(0).flip(0)
    assert torch.equal(predicted.view(-1), expected)


def test_threshold_tensor_is_float32_k_over_100():
    assert THRESHOLDS.dtype == torch.float32
    assert THRESHOLDS.tolist() == [float(t) for t in TAUS]


@pytest.mark.parametrize("shape", [(1, 1, 1, 1), (2, 3, 5, 7), (4, 2, 16, 16), (3, 14, 9, 4)])
def test_metric_matches_brute_force(shape):
    rng = np.random.default_rng(sum(shape))
    s, m, has = make_batch(rng, *shape)
    result = run_metric([(s, m, has, np.arange(shape[0]))], shape[1])
    ref, rows = reference(s, m, has)
    check_against_reference(result, ref)
    records = result["records"]
    assert len(rows) == len(records["index"])
    for (b, c, region, hit, preds, inters, cnr), i in zip(rows, range(len(rows))):
        assert (records["index"][i].item(), records["class"][i].item()) == (b, c)
        np.testing.assert_allclose(records["cnr"][i].item(), cnr, rtol=1e-9, atol=1e-9)
        assert records["region"][i].item() == region
        assert records["hit"][i].item() == hit
        assert records["predicted"][i].tolist() == preds
        assert records["inter"][i].tolist() == inters


@pytest.mark.parametrize("chunk", [None, 5], ids=["a-chunk-a-map", "several-chunks-a-map"])
def test_cnr_takes_only_the_pixels_the_model_saw(chunk, monkeypatch):
    """With ``seen`` (a window per image: a centre crop, one edge, all, none of a region), CNR is the
    brute-force one over the seen pixels alone; every other value is the one without ``seen``. Also
    where a map spans several chunks of the CPU pass (chunks shrunk to 5 pixels)."""
    if chunk is not None:
        monkeypatch.setattr(grounding, "_CPU_CHUNK_PIXELS", chunk)
    shape = (3, 4, 9, 7)
    rng = np.random.default_rng(sum(shape))
    batch, _, height, width = shape
    s, m, has = make_batch(rng, *shape)
    has[0, 0], m[0, 0] = True, False
    m[0, 0, :, : width // 4] = True  # a region the model never saw: no CNR
    seen = np.zeros((batch, height, width), dtype=bool)
    seen[0, :, width // 4 :] = True
    seen[1, 1:, 2:-1] = True
    seen[2:] = True  # all
    result = run_metric([(s, m, has, np.arange(batch))], shape[1], seen)
    ref, rows = reference(s, m, has, seen=seen)
    check_against_reference(result, ref)
    assert has[0, 0] and np.isnan(result["records"]["cnr"][0].item())
    np.testing.assert_allclose(result["records"]["cnr"].numpy(), [row[-1] for row in rows], rtol=1e-9, atol=1e-9)
    everything = run_metric([(s, m, has, np.arange(batch))], shape[1])
    for name in ("predicted", "inter", "hit"):
        assert torch.equal(result["records"][name], everything["records"][name]), name
    assert not np.allclose(everything["records"]["cnr"].nan_to_num().numpy(),
                           result["records"]["cnr"].nan_to_num().numpy())


def test_record_states_hold_only_the_graded_pairs():
    """Ungraded pairs (no mask, or an empty one) never reach the record states, so a
    15,000-image, 21-class run keeps a few percent of its pairs; the records still equal the
    brute-force rows, image indices included, over uneven batches."""
    rng = np.random.default_rng(5)
    s, m, has = make_batch(rng, 9, 6, 7, 5, p_mask=0.25)
    index = np.arange(9) + 100
    metric = GroundingMetrics(6)
    for part in (slice(0, 4), slice(4, 5), slice(5, 9)):
        metric.update(torch.from_numpy(s[part]), torch.from_numpy(m[part]), torch.from_numpy(has[part]),
                      torch.as_tensor(index[part]))
    ref, rows = reference(s, m, has)
    assert 0 < len(rows) < has.sum() < has.size  # some pairs without a mask, some with an empty one
    for name in metric.record_layout():
        assert sum(len(t) for t in getattr(metric, name)) == len(rows), name
    result = metric.compute()
    check_against_reference(result, ref)
    records = result["records"]
    assert records["index"].tolist() == [index[b] for b, *_ in rows]
    assert records["class"].tolist() == [c for _, c, *_ in rows]
    assert records["region"].tolist() == [region for _, _, region, *_ in rows]
    assert records["hit"].tolist() == [hit for *_, hit, _, _, _ in rows]
    assert records["predicted"].tolist() == [preds for *_, preds, _, _ in rows]
    assert records["inter"].tolist() == [inters for *_, inters, _ in rows]


def test_cnr_edge_cases_against_numpy():
    """A constant map scores 0; a region covering the frame, or a map that is exactly the
    region's indicator (no noise, a contrast), has no CNR: counted out, not averaged in."""
    region = np.zeros((1, 1, 6, 6), dtype=bool)
    region[0, 0, 1:3, 2:5] = True
    ramp = np.linspace(0, 1, 36, dtype=np.float32).reshape(1, 1, 6, 6)
    cases = {"constant": np.zeros_like(ramp), "indicator": region.astype(np.float32), "ramp": ramp}
    has = np.ones((1, 1), dtype=bool)
    for name, smap in cases.items():
        result = run_metric([(smap, region, has, np.arange(1))], 1)
        expected = reference_cnr(smap[0, 0], region[0, 0])
        assert result["cnr_pairs"].item() == (expected is not None), name
        if expected is None:
            assert np.isnan(result["cnr"].item()) and np.isnan(result["records"]["cnr"].item()), name
        else:
            assert result["cnr"].item() == pytest.approx(expected, abs=1e-12), name
    everywhere = np.ones_like(region)
    result = run_metric([(ramp, everywhere, has, np.arange(1))], 1)
    assert result["pairs"].item() == 1 and result["cnr_pairs"].item() == 0 and np.isnan(result["macro/cnr"].item())


def cnr_test_maps(height, width, seed):
    """Min-max normalised maps [1, 3, H, W] that stress the variance: a smooth map, one far from
    0 with little spread (0.9 + 0.001 noise), and a high-contrast one with little noise; boxes."""
    rng = np.random.default_rng(seed)
    noise = rng.random((3, height, width), dtype=np.float32)
    region = np.zeros((3, height, width), dtype=bool)
    region[:, height // 4 : height // 2, width // 5 : 3 * width // 5] = True
    smooth = torch.nn.functional.avg_pool2d(torch.from_numpy(noise[:1]), 9, stride=1, padding=4).numpy()[0]
    maps = np.stack([smooth, 0.9 + 1e-3 * noise[1], np.where(region[2], 0.95, 0.05) + 1e-3 * noise[2]]).astype(np.float32)
    flat = maps.reshape(3, -1)
    flat -= flat.min(1, keepdims=True)
    flat /= flat.max(1, keepdims=True)
    flat[1, -1], flat[1, -2] = 0.0, 1.0  # the offset map keeps its extremes outside the region
    return maps[None], region[None]


@pytest.mark.parametrize("size", [(224, 224), (2320, 2828)], ids=["224", "native"])
def test_cnr_equals_float64_brute_force_far_from_zero_and_at_native_size(size):
    """CNR's float64 sums are taken in the histogram pass, block by block (a native-size map spans
    many); they equal numpy's float64 mean and variance to 1e-9 even where sum(s^2) - n mean^2
    would cancel (values near 0.9 with a spread of 0.001) and where the contrast is 1000 noises."""
    maps, region = cnr_test_maps(*size, seed=sum(size))
    records = grounding_records(torch.from_numpy(maps), torch.from_numpy(region), torch.ones(1, 3, dtype=torch.bool))
    expected = [reference_cnr(maps[0, k], region[0, k]) for k in range(3)]
    assert expected[2] > 300  # a high-contrast map indeed
    np.testing.assert_allclose(records["cnr"][0].numpy(), expected, rtol=1e-9, atol=0)


def test_queries_are_summed_into_their_findings_classes():
    """The query axis: pair (image, slot) is scored under its finding's class; several queries of
    one finding on an image each count; unused slots (-1) count nowhere. Equals the brute-force
    loop, records included (in image, slot order, with the slot and the finding)."""
    rng = np.random.default_rng(21)
    s, m, has = make_batch(rng, 7, 4, 8, 6, p_mask=0.8)
    pair_class = rng.integers(0, 3, size=(7, 4))  # 3 findings, 4 query slots: repeats per image
    pair_class[~has] = -1
    metric = GroundingMetrics(3)
    for part in (slice(0, 3), slice(3, 7)):
        metric.update(*(torch.from_numpy(a[part]) for a in (s, m, has)), torch.arange(7)[part],
                      torch.from_numpy(pair_class[part]))
    result = metric.compute()
    ref, rows = reference(s, m, has, pair_class, num_classes=3)
    check_against_reference(result, ref)
    records = result["records"]
    graded = [(b, k) for b in range(7) for k in range(4) if has[b, k] and m[b, k].any()]
    assert list(zip(records["index"].tolist(), records["slot"].tolist())) == graded
    assert records["class"].tolist() == [c for _, c, *_ in rows]
    np.testing.assert_allclose(records["cnr"].numpy(), [row[-1] for row in rows], rtol=1e-9, atol=1e-9)


@settings(max_examples=25, deadline=None)
@given(
    B=st.integers(1, 4), C=st.integers(1, 4), H=st.integers(1, 12), W=st.integers(1, 12),
    seed=st.integers(0, 2**32 - 1), p=st.floats(0, 1),
)
def test_metric_matches_brute_force_hypothesis(B, C, H, W, seed, p):
    rng = np.random.default_rng(seed)
    s, m, has = make_batch(rng, B, C, H, W, p_mask=p)
    ref, _ = reference(s, m, has)
    check_against_reference(run_metric([(s, m, has, np.arange(B))], C), ref)


def test_batching_and_order_do_not_change_results():
    rng = np.random.default_rng(7)
    s, m, has = make_batch(rng, 12, 3, 10, 10)
    whole = run_metric([(s, m, has, np.arange(12))], 3)
    order = rng.permutation(12)
    pieces = [order[:5], order[5:6], order[6:]]
    split = run_metric([(s[i], m[i], has[i], i) for i in pieces], 3)
    for key in ("pairs", "hits", "constant_maps", "tied_maxima", "empty_masks"):
        assert torch.equal(whole[key], split[key])
    for key in ("dice_curve", "iou_curve", "pooled_dice_curve", "pooled_iou_curve"):
        torch.testing.assert_close(whole[key], split[key], rtol=0, atol=1e-12, equal_nan=True)
    for key in ("index", "class", "region", "predicted", "inter"):
        assert torch.equal(whole["records"][key], split["records"][key])


def pg(smap, region):
    s = torch.tensor(smap, dtype=torch.float32).view(1, 1, *np.shape(smap))
    m = torch.tensor(region, dtype=torch.bool).view_as(s)
    return grounding_records(s, m, torch.ones(1, 1, dtype=torch.bool))


def test_pointing_game_rules():
    region = [[0, 0, 0], [0, 1, 1], [0, 0, 0]]
    # unique maximum inside
    assert pg([[0, 0.2, 0], [0.1, 1, 0.3], [0, 0, 0]], region)["hit"].item()
    # unique maximum outside
    assert not pg([[1, 0.2, 0], [0.1, 0.9, 0.3], [0, 0, 0]], region)["hit"].item()
    # tie: one maximum inside, one outside -> hit, counted as tied
    r = pg([[1, 0, 0], [0, 0, 1], [0, 0, 0]], region)
    assert r["hit"].item() and r["tied"].item()
    # tie entirely outside -> miss
    r = pg([[1, 0, 1], [0, 0.5, 0], [0, 0, 0]], region)
    assert not r["hit"].item() and r["tied"].item()
    # maximum on the boundary pixel of the region -> hit
    assert pg([[0, 0, 0], [0, 0.5, 1], [0, 0, 0]], region)["hit"].item()
    # constant map (normalised to zeros) -> miss, even though every pixel "attains" the maximum
    r = pg([[0, 0, 0], [0, 0, 0], [0, 0, 0]], region)
    assert not r["hit"].item() and r["constant"].item() and not r["tied"].item()
    # full-image region and constant map: still a miss
    assert not pg(np.zeros((3, 3)), np.ones((3, 3)))["hit"].item()


def test_hand_made_dice_and_iou():
    # 2x2 map: values 1, 0.6, 0.3, 0; region = the two top pixels.
    s = torch.tensor([[[[1.0, 0.6], [0.3, 0.0]]]])
    m = torch.tensor([[[[True, True], [False, False]]]])
    result = run_metric([(s.numpy(), m.numpy(), np.ones((1, 1), bool), [0])], 1)
    # tau=0.5: B = {1, 0.6} = R -> Dice 1, IoU 1; tau=0.2: B has 3 pixels -> Dice 4/5, IoU 2/3
    assert result["dice@0.5"].item() == 1.0 and result["iou@0.5"].item() == 1.0
    assert result["dice_curve"][0, 20].item() == pytest.approx(0.8)
    assert result["iou_curve"][0, 20].item() == pytest.approx(2 / 3)
    # tau=0: every pixel -> Dice 2*2/(4+2)
    assert result["dice_curve"][0, 0].item() == pytest.approx(2 / 3)
    # best Dice is 1.0, first reached at tau = 0.31 (0.3 < 0.31 <= 0.6)
    assert result["dice@best"].item() == 1.0
    assert result["dice@best_tau"].item() == pytest.approx(0.31)
    assert result["pointing_game"].item() == 1.0


def test_macro_mean_skips_classes_without_pairs():
    s = np.zeros((2, 3, 2, 2), np.float32)
    s[:, :, 0, 0] = 1
    m = np.zeros((2, 3, 2, 2), bool)
    m[:, 0, 0, 0] = True  # class 0: hits
    m[:, 1, 1, 1] = True  # class 1: misses
    has = np.array([[True, True, False], [True, True, False]])
    result = run_metric([(s, m, has, [0, 1])], 3)
    assert result["pointing_game"][:2].tolist() == [1.0, 0.0]
    assert np.isnan(result["pointing_game"][2].item())
    assert result["macro/pointing_game"].item() == 0.5
    assert result["classes_with_pairs"].item() == 2


def test_validation_rejects_unnormalised_maps():
    metric = GroundingMetrics(1)
    m = torch.ones(1, 1, 2, 2, dtype=torch.bool)
    has = torch.ones(1, 1, dtype=torch.bool)
    with pytest.raises(ValueError, match=r"\[0, 1\]"):
        metric.update(torch.full((1, 1, 2, 2), 2.0), m, has)
    with pytest.raises(ValueError, match="min-max normalised"):
        metric.update(torch.full((1, 1, 2, 2), 0.5), m, has)
    with pytest.raises(ValueError, match="min-max normalised"):
        metric.update(torch.ones(1, 1, 2, 2), m, has)
    with pytest.raises(ValueError, match="bool"):
        metric.update(torch.ones(1, 1, 2, 2), m.float(), has)


@pytest.mark.parametrize("seen", [False, True], ids=["all-seen", "a-window"])
@pytest.mark.parametrize("shape,block", [((3, 4, 9, 7), 5), ((3, 4, 9, 7), 1 << 24), ((1, 2, 300, 301), 1 << 16)],
                         ids=["blocks-of-part-of-a-map", "one-block", "blocks-of-one-map"])
def test_block_pass_equals_the_cpu_pass(shape, block, seen, monkeypatch):
    """The pass other devices run (torch operations in blocks, run here on the CPU) gives the CPU
    pass's code counts exactly and its float64 sums to rounding, with values on every threshold."""
    monkeypatch.setattr(grounding, "_BLOCK_ELEMENTS", block)
    monkeypatch.setattr(grounding, "_CPU_CHUNK_PIXELS", 1000)  # the 300 x 301 maps in several chunks
    rng = np.random.default_rng(sum(shape))
    s, m, _ = make_batch(rng, *shape)
    s.reshape(-1)[:101] = THRESHOLDS.numpy()
    batch, classes, height, width = shape
    pixels = height * width
    window = torch.from_numpy(rng.random((batch, height, width)) > 0.3) if seen else None
    expected = grounding._scan(torch.from_numpy(s), torch.from_numpy(m), True, window)
    sides = torch.from_numpy(m).reshape(batch, classes, pixels).view(torch.uint8)
    if seen:
        sides = sides + 2 * (~window.reshape(batch, 1, pixels)).view(torch.uint8)
    codes = expected[0].shape[-1]
    counts, sums = grounding._scan_blocks(torch.from_numpy(s).reshape(-1, pixels), sides.reshape(-1, pixels), codes,
                                          True)
    assert torch.equal(counts.view(expected[0].shape), expected[0])
    for k in (0, 1):
        torch.testing.assert_close(sums[k].view(expected[0].shape), expected[1 + k], rtol=1e-12, atol=1e-15)


@pytest.mark.parametrize("bad", [float("nan"), 1.5, -0.25])
def test_values_outside_the_unit_interval_are_refused_without_validation(bad):
    """The metric as a run builds it (``validate_args=False``): a value outside [0, 1] or NaN is
    an error naming the map, never a pixel counted in another pair's histogram or a lost one."""
    s = torch.rand(2, 3, 8, 8)
    s[1, 2, 4, 5] = bad
    with pytest.raises(ValueError, match=r"must lie in \[0, 1\].*image 1, slot 2 .*normalise"):
        GroundingMetrics(3, validate_args=False).update(s, s > 0.5, torch.ones(2, 3, dtype=torch.bool))


@pytest.mark.slow  # numba's cache at import and its first call's thread pool: a fresh interpreter
def test_the_cpu_pass_runs_without_a_cache_folder_and_leaves_torchs_thread_count():
    """In a fresh process where numba finds no folder to cache its compiled loop in (a read-only
    install and home: here, numba told to look only where a script has none), the metric imports and
    counts; and the CPU pass leaves torch's thread count as the user set it (numba's OpenMP pool,
    started by the first call in a process, sets the OpenMP thread count torch reads)."""
    code = ("import torch; torch.set_num_threads(1); from xbench.metrics import threshold_counts; "
            "predicted, _ = threshold_counts(torch.tensor([[[[0.0, 0.5, 1.0]]]]), torch.zeros(1, 1, 1, 3, dtype=torch.bool)); "
            "print(predicted[0, 0, [0, 50, 51, 100]].tolist(), torch.get_num_threads())")
    environment = {**os.environ, "NUMBA_CACHE_LOCATOR_CLASSES": "IPythonCacheLocator"}
    environment.pop("OMP_NUM_THREADS", None)  # an xdist worker's setting (conftest), not a user's
    done = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, env=environment,
                          timeout=SUBPROCESS_SAFETY_TIMEOUT, check=False)
    assert done.returncode == 0, done.stderr
    assert done.stdout.split() == ["[3,", "2,", "1,", "1]", "1"]
