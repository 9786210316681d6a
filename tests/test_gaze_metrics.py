"""The gaze metrics (`xbench.metrics.gaze`) equal pysaliency 0.2.22's functions and etsaliencymaps' own
NCC code, on random maps and fixations and on the edge cases: a constant map, a reading with one
fixation, fixations where the gaze density is 0 (outside the part of the image shown), ties, a map
equal to the gaze; and the metric gives one process's numbers when the pairs are split over two.

pysaliency imports ``pkg_resources`` for its bundled external models and datasets, which setuptools
81 and later no longer ship, and its ROC code calls ``np.trapz``, which NumPy 2 renamed
``np.trapezoid`` (and later removed); its metrics never use the first, so a stand-in module is
registered before the import, and the old name is given back to the new function (`_pysaliency`)."""

from __future__ import annotations

import json
import socket
import sys
import types
from pathlib import Path

import numpy as np
import pytest
import torch
import torch.distributed as dist
import torch.multiprocessing as mp

from xbench.metrics.gaze import DENSITY_FLOOR, VALUES, GazeMetrics, gaze_values, minmax

GOLDEN = Path(__file__).parent / "golden" / "etsaliencymaps_ncc.npz"
SIDE = 16


@pytest.fixture(scope="module", autouse=True)
def _pysaliency_shims():
    """The stand-in ``pkg_resources`` and ``np.trapz`` for this module's tests only: a stand-in left in
    ``sys.modules`` would break every later import of the real one in the worker (submitit's)."""
    with pytest.MonkeyPatch.context() as patch:
        try:
            import pkg_resources  # noqa: F401
        except ImportError:
            stand_in = types.ModuleType("pkg_resources")
            stand_in.resource_string = stand_in.resource_listdir = None
            patch.setitem(sys.modules, "pkg_resources", stand_in)
        if not hasattr(np, "trapz"):
            patch.setattr(np, "trapz", np.trapezoid, raising=False)
        yield


def _pysaliency():
    import pysaliency

    return pysaliency


class _Maps:
    """A pysaliency saliency-map model whose map of stimulus ``n`` is ``maps[n]`` (each stimulus is
    filled with its own index)."""

    def __new__(cls, maps):
        pysaliency = _pysaliency()

        class Fixed(pysaliency.SaliencyMapModel):
            def __init__(self):
                super().__init__(caching=False)

            def _saliency_map(self, stimulus):
                return np.asarray(maps[int(np.asarray(stimulus)[0, 0])], dtype=float)

        return Fixed()


def _fixation_list(counts: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    ys, xs = np.nonzero(counts)
    repeats = counts[ys, xs].astype(int)
    return np.repeat(xs, repeats).astype(float), np.repeat(ys, repeats).astype(float)


def reference(saliency, gaze, fixations, shuffled, baseline) -> dict[str, float]:
    """Each metric of one pair as pysaliency 0.2.22 computes it (NCC and sNCC: etsaliencymaps' formula,
    checked against their code in `test_ncc_equals_etsaliencymaps`)."""
    ps = _pysaliency()
    s, g, f, h, b = (np.asarray(a, dtype=np.float64) for a in (saliency, gaze, fixations, shuffled, baseline))
    xs, ys = _fixation_list(f)
    out = {"cc": ps.metrics.CC(s, g), "sim": ps.metrics.SIM(s, g), "kl_divergence": ps.metrics.MIT_KLDiv(s, g)}
    with np.errstate(invalid="ignore", divide="ignore"):
        ncc = lambda a, v: np.mean((a - a.mean()) * (v - v.mean())) / np.std(v) / np.std(a)  # noqa: E731
        out["ncc"] = ncc(g, s)
        out["shuffled_ncc"] = ncc(g, s) - ncc(b.astype(np.float32), s)
    if not len(xs):
        return {**out, **{k: np.nan for k in ("nss", "auc_judd", "shuffled_auc", "information_gain")}}
    out["nss"] = float(np.mean(ps.metrics.NSS(s, xs, ys)))
    stimuli = ps.Stimuli([np.full((SIDE, SIDE), n, dtype=float) for n in range(2)])
    own = ps.Fixations.create_without_history(xs, ys, np.zeros(len(xs), dtype=int))
    model = _Maps([s, s])
    out["auc_judd"] = model.AUC_Judd(ps.Stimuli([stimuli.stimuli[0]]), own, jitter=False)
    hx, hy = _fixation_list(h)
    if len(hx):
        both = ps.Fixations.create_without_history(np.concatenate([xs, hx]), np.concatenate([ys, hy]),
                                                   np.r_[np.zeros(len(xs), int), np.ones(len(hx), int)])
        out["shuffled_auc"] = model.AUC_per_image(stimuli, both, nonfixations="shuffled")[0]
    else:
        out["shuffled_auc"] = np.nan
    density = lambda m: ps.models.SaliencyMapNormalizingModel(_Maps([m]), minimum_value=DENSITY_FLOOR)  # noqa: E731
    out["information_gain"] = density(s).information_gain(
        ps.Stimuli([stimuli.stimuli[0]]), own, baseline_model=density(minmax(torch.from_numpy(b)).numpy()))
    return out


def _normalised(rng, side=SIDE):
    s = rng.random((side, side))
    return (s - s.min()) / (s.max() - s.min())


def _gaussian(side, cy, cx, sigma):
    axis = np.arange(side) + 0.5
    yy, xx = np.meshgrid(axis, axis, indexing="ij")
    g = np.exp(-((yy - cy) ** 2 + (xx - cx) ** 2) / (2 * sigma**2))
    return g / g.sum()


def cases() -> dict[str, tuple]:
    """name -> (map, gaze density, fixation counts, shuffled counts, centre bias), [S, S] float64 each."""
    rng = np.random.default_rng(5)
    centre = _gaussian(SIDE, SIDE / 2, SIDE / 2, SIDE / 4)
    out = {}
    for k in range(4):
        f = rng.poisson(0.3, (SIDE, SIDE)).astype(float)
        g = _gaussian(SIDE, *rng.uniform(3, SIDE - 3, 2), 2.5) * 0.7 + 0.3 * f / f.sum()
        out[f"random{k}"] = (_normalised(rng), g, f, rng.poisson(0.5, (SIDE, SIDE)).astype(float), centre)
    f = rng.poisson(0.3, (SIDE, SIDE)).astype(float)
    g = _gaussian(SIDE, 6, 9, 3)
    out["constant_map"] = (np.zeros((SIDE, SIDE)), g, f, rng.poisson(0.5, (SIDE, SIDE)).astype(float), centre)
    one = np.zeros((SIDE, SIDE))
    one[4, 11] = 1
    out["one_fixation"] = (_normalised(rng), _gaussian(SIDE, 4.5, 11.5, 1.5), one,
                           rng.poisson(0.5, (SIDE, SIDE)).astype(float), centre)
    # the gaze drawn only over the part of the image shown (rows 0-9); fixations also below it
    shown = _gaussian(SIDE, 5, 8, 3)
    shown[10:] = 0
    outside = rng.poisson(0.4, (SIDE, SIDE)).astype(float)
    outside[12:, :] += 2
    out["outside_shown"] = (_normalised(rng), shown / shown.sum(), outside,
                            rng.poisson(0.5, (SIDE, SIDE)).astype(float), centre)
    ties = np.round(_normalised(rng) * 3) / 3
    fixed = rng.poisson(0.5, (SIDE, SIDE)).astype(float)
    out["ties"] = (ties, _gaussian(SIDE, 8, 8, 3), fixed, rng.poisson(0.5, (SIDE, SIDE)).astype(float), centre)
    g = _gaussian(SIDE, 7, 5, 2)
    out["map_is_gaze"] = (g / g.max(), g, rng.poisson(0.5, (SIDE, SIDE)).astype(float),
                          rng.poisson(0.5, (SIDE, SIDE)).astype(float), centre)
    out["map_is_centre_bias"] = (minmax(torch.from_numpy(centre)).numpy(), g,
                                 rng.poisson(0.5, (SIDE, SIDE)).astype(float), np.zeros((SIDE, SIDE)), centre)
    return out


CASES = cases()


@pytest.mark.parametrize("name", list(CASES))
def test_each_metric_equals_pysaliency(name):
    s, g, f, h, b = CASES[name]
    mine = gaze_values(*(torch.from_numpy(a)[None] for a in (s, g, f, h)), torch.from_numpy(b).float())[0]
    theirs = reference(s, g, f, h, b.astype(np.float32))
    for k, key in enumerate(VALUES):
        expected = float(theirs[key])
        if np.isnan(expected):
            assert torch.isnan(mine[k]), (name, key, float(mine[k]))
        else:  # sNCC: their centre bias is cast to float32, whose mean and deviation NumPy keeps in float32
            tolerance = 1e-6 if key == "shuffled_ncc" else 1e-9
            assert float(mine[k]) == pytest.approx(expected, rel=tolerance, abs=tolerance), (name, key)


def test_edge_cases_say_what_they_mean():
    """The edge cases land where their definitions put them (so a reference that drifted with us is caught)."""
    value = lambda name: dict(zip(VALUES, gaze_values(  # noqa: E731
        *(torch.from_numpy(a)[None] for a in CASES[name][:4]), torch.from_numpy(CASES[name][4]))[0].tolist()))
    constant = value("constant_map")
    assert constant["nss"] == 0 and constant["cc"] == 0 and np.isnan(constant["ncc"])
    assert constant["sim"] == pytest.approx(np.minimum(1 / SIDE**2, CASES["constant_map"][1]).sum())
    assert value("map_is_gaze")["cc"] == pytest.approx(1) and value("map_is_gaze")["kl_divergence"] <= 1e-12
    assert value("map_is_centre_bias")["information_gain"] == pytest.approx(0, abs=1e-12)
    assert np.isnan(value("map_is_centre_bias")["shuffled_auc"])  # no other image's fixation


def test_ncc_equals_etsaliencymaps():
    """Against etsaliencymaps' ``normalised_corr`` and ``shuffled_normalised_corr`` run on the golden
    file's cases (tools/parity/etsaliencymaps_ncc.py), a constant map's NaN included."""
    golden = np.load(GOLDEN)
    meta = json.loads(str(golden["meta"]))
    assert meta["repository"] == "ricbl/etsaliencymaps" and len(meta["cases"]) >= 8
    for i, _ in enumerate(meta["cases"]):
        g, s, b = (torch.from_numpy(golden[f"{i}_{k}"])[None] for k in ("gaze", "map", "baseline"))
        zeros = torch.zeros_like(s)
        values = dict(zip(VALUES, gaze_values(s, g, zeros, zeros, b[0])[0].tolist()))
        for key, theirs in (("ncc", golden[f"{i}_ncc"]), ("shuffled_ncc", golden[f"{i}_sncc"])):
            if np.isnan(theirs):
                assert np.isnan(values[key]), (meta["cases"][i], key)
            else:  # their centre bias is cast to float32 (shuffled_normalised_corr): a few ulps apart
                assert values[key] == pytest.approx(float(theirs), rel=1e-6, abs=1e-7), (meta["cases"][i], key)


def batch(seed=3, images=7, classes=3, side=SIDE):
    """A batch of gaze keys as a datamodule gives them, some pairs without gaze."""
    rng = np.random.default_rng(seed)
    s = rng.random((images, classes, side, side))
    s = (s - s.min((2, 3), keepdims=True)) / (s.max((2, 3), keepdims=True) - s.min((2, 3), keepdims=True))
    s[0, 1] = 0  # a constant map
    f = rng.poisson(0.2, (images, classes, side, side)).astype(float)
    g = f + 0.05
    g /= g.sum((2, 3), keepdims=True)
    has = rng.random((images, classes)) < 0.7
    h = rng.poisson(0.3, (images, side, side)).astype(float)
    to = lambda a, dtype=torch.float32: torch.from_numpy(a).to(dtype)  # noqa: E731
    return to(s), to(g), to(f), to(has, torch.bool), to(h), torch.arange(images)


def test_metric_sums_equal_the_records_and_the_kernels():
    s, g, f, has, h, index = batch()
    baseline = torch.from_numpy(_gaussian(SIDE, 8, 8, 4)).float()
    metric = GazeMetrics(3, baseline)
    metric.update(s[:4], g[:4], f[:4], has[:4], h[:4], index[:4])
    metric.update(s[4:], g[4:], f[4:], has[4:], h[4:], index[4:])
    out = metric.compute()
    image, cls = has.nonzero(as_tuple=True)
    direct = gaze_values(s[image, cls], g[image, cls], f[image, cls], h[image], baseline)
    records = out["records"]
    assert torch.equal(records["index"], image) and torch.equal(records["class"], cls)
    for k, key in enumerate(VALUES):
        assert torch.allclose(records[key], direct[:, k], equal_nan=True, rtol=0, atol=0)
        for c in range(3):
            chosen = direct[cls == c, k]
            chosen = chosen[~chosen.isnan()]
            assert int(out["defined"][c, k]) == len(chosen)
            assert float(out["means"][c, k]) == pytest.approx(float(chosen.mean()), rel=1e-12)
    assert out["pairs"].tolist() == torch.bincount(cls, minlength=3).tolist()
    assert int(out["defined"][:, VALUES.index("ncc")].sum()) == int(has.sum()) - int(has[0, 1])


def _worker(rank, world, port, out_path):
    dist.init_process_group("gloo", init_method=f"tcp://127.0.0.1:{port}", rank=rank, world_size=world)
    try:
        s, g, f, has, h, index = batch()
        metric = GazeMetrics(3, torch.from_numpy(_gaussian(SIDE, 8, 8, 4)).float())
        mine = [i for i in range(len(index)) if (i < 5) == (rank == 0)]  # 5 images and 2: uneven
        for start in range(0, len(mine), 2):
            i = torch.tensor(mine[start:start + 2])
            metric.update(s[i], g[i], f[i], has[i], h[i], index[i])
        out = metric.compute()
        if rank == 0:
            torch.save({"means": out["means"], "defined": out["defined"], "pairs": out["pairs"],
                        "records": out["records"]}, out_path)
    finally:
        dist.destroy_process_group()


@pytest.mark.slow
def test_ddp_equals_single_process(tmp_path):
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        port = sock.getsockname()[1]
    mp.spawn(_worker, args=(2, port, tmp_path / "out.pt"), nprocs=2, join=True)
    synced = torch.load(tmp_path / "out.pt")
    s, g, f, has, h, index = batch()
    single = GazeMetrics(3, torch.from_numpy(_gaussian(SIDE, 8, 8, 4)).float())
    single.update(s, g, f, has, h, index)
    expected = single.compute()
    assert torch.equal(synced["pairs"], expected["pairs"]) and torch.equal(synced["defined"], expected["defined"])
    assert torch.allclose(synced["means"], expected["means"], rtol=1e-12, equal_nan=True)
    order = torch.argsort(synced["records"]["index"] * 3 + synced["records"]["class"])
    for key, value in expected["records"].items():
        assert torch.equal(synced["records"][key][order].nan_to_num(-9), value.nan_to_num(-9)), key


def test_a_batch_without_gaze_adds_nothing():
    s, g, f, has, h, index = batch()
    metric = GazeMetrics(3, torch.from_numpy(_gaussian(SIDE, 8, 8, 4)).float())
    metric.update(s, g, f, torch.zeros_like(has), h, index)
    out = metric.compute()
    assert int(out["pairs"].sum()) == 0 and out["means"].isnan().all() and len(out["records"]["index"]) == 0


def test_the_aucs_do_not_depend_on_the_chunking(monkeypatch):
    """Pairs sorted in chunks (a large batch) give the values of one pass."""
    from xbench.metrics import gaze

    s, g, f, has, h, index = batch(images=12)
    pairs = (s.flatten(0, 1), f.flatten(0, 1), h.repeat_interleave(3, 0))
    whole = gaze_values(*pairs[:1], g.flatten(0, 1), *pairs[1:], torch.rand(SIDE, SIDE))
    monkeypatch.setattr(gaze, "_CHUNK_ELEMENTS", 5 * SIDE * SIDE)
    chunked = gaze_values(*pairs[:1], g.flatten(0, 1), *pairs[1:], torch.rand(SIDE, SIDE))
    for key in ("auc_judd", "shuffled_auc"):
        k = VALUES.index(key)
        assert torch.equal(whole[:, k].nan_to_num(-1), chunked[:, k].nan_to_num(-1)), key
