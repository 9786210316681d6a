"""The metrics (grounding, classification, cheXlocalize's native rows) give one process's numbers
when the data is split unevenly over 2 or 3 processes."""

import socket
from functools import partial

import numpy as np
import pytest
import torch
import torch.distributed as dist
import torch.multiprocessing as mp

from xbench.metrics import ClassificationMetrics, GroundingMetrics
from xbench.metrics.native import ChexlocalizeRecords, chexlocalize_means, model_row
from xbench.metrics.phrases import SentenceScores, sentence_recognition

pytestmark = pytest.mark.slow  # DDP: processes of their own, whose imports are most of the cost

NUM_SAMPLES, NUM_CLASSES, SIZE = 17, 3, 12


def make_data():
    rng = np.random.default_rng(11)
    s = rng.random((NUM_SAMPLES, NUM_CLASSES, SIZE, SIZE), dtype=np.float32)
    flat = s.reshape(NUM_SAMPLES, NUM_CLASSES, -1)
    flat[..., 0], flat[..., 1] = 0.0, 1.0
    flat[::5, 1] = 0.0  # constant maps
    m = np.zeros_like(s, dtype=bool)
    for i in range(NUM_SAMPLES):
        for c in range(NUM_CLASSES):
            y, x = rng.integers(0, SIZE - 3, size=2)
            m[i, c, y : y + rng.integers(1, 5), x : x + rng.integers(1, 5)] = True
    has = rng.random((NUM_SAMPLES, NUM_CLASSES)) < 0.7
    logits = rng.normal(size=(NUM_SAMPLES, NUM_CLASSES)).astype(np.float32)
    labels = rng.integers(-1, 2, size=(NUM_SAMPLES, NUM_CLASSES))
    # a phrase dataset's view of the same maps: slot k of image i is a query of finding
    # query_class[i, k] (-1: an unused slot, no mask), several queries of one finding per image
    query_class = rng.integers(0, NUM_CLASSES - 1, size=(NUM_SAMPLES, NUM_CLASSES))
    query_class[~has] = -1
    return [torch.from_numpy(a) for a in (s, m, has, logits, labels, query_class)]


def evaluate(indices, batch_size, queries=False):
    s, m, has, logits, labels, query_class = make_data()
    # a run's own grounding records Quantus' families too (class pairs only, not a phrase view)
    grounding = GroundingMetrics(NUM_CLASSES, map_quality=not queries)
    classification, native = ClassificationMetrics(NUM_CLASSES), ChexlocalizeRecords(NUM_CLASSES)
    sentences = SentenceScores()  # the queries' scores: a query stated where its finding's label is 1
    for start in range(0, len(indices), batch_size):
        i = torch.as_tensor(indices[start : start + batch_size], dtype=torch.int64)
        grounding.update(s[i], m[i], has[i], i, query_class[i] if queries else None)
        classification.update(logits[i], labels[i], i)
        stated = labels[i].gather(1, query_class[i].clamp(min=0)) == 1
        sentences.update(i, query_class[i], stated, logits[i].gather(1, query_class[i].clamp(min=0)))
    for i in indices:  # each pair with a region, the map at its native size (12 x 12)
        for c in torch.nonzero(has[i]).flatten().tolist():
            native.update(m[i, c], c, i, partial(model_row, s[i, c], m[i, c], 0.5))
    evaluated = torch.arange(NUM_SAMPLES)  # the recognition's resamples: every image, as one process sees them
    recognition = sentence_recognition(sentences.compute(), [f"i{k:02d}" for k in range(NUM_SAMPLES)], evaluated,
                                       list("abc"), "ddp", replicates=50)
    return (grounding.compute(), classification.compute(), chexlocalize_means(native.compute(), list("abc")),
            recognition)


def _worker(rank, world, port, cases, out_path):
    """Every case of one world size in one process group (a spawn costs each process an import of
    torch): a case's ``shares`` give this rank its sample indices; rank 0 saves each case's results."""
    dist.init_process_group("gloo", init_method=f"tcp://127.0.0.1:{port}", rank=rank, world_size=world)
    try:
        results = {}
        for name, (shares, queries) in cases.items():
            g, c, native, recognition = evaluate(shares[rank], batch_size=rank + 2, queries=queries)
            results[name] = {"g": dict(g.items()), "c": dict(c.items()), "native": native,
                             "sentences": recognition}
        results["collectives"] = count_collectives(rank)
        if rank == 0:
            torch.save(results, out_path)
    finally:
        dist.destroy_process_group()


def free_port():
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return sock.getsockname()[1]


def assert_same(a, b):
    if isinstance(a, dict):
        assert a.keys() == b.keys()
        for key in a:
            assert_same(a[key], b[key])
    elif a.is_floating_point():
        torch.testing.assert_close(a, b, rtol=0, atol=1e-12, equal_nan=True)
    else:
        assert torch.equal(a, b)


CASES = {
    2: {"2-proc": ([list(range(0, 12)), list(range(12, 17))], False),
        # (image, query) pairs summed into their findings' classes
        "2-proc-queries": ([list(range(0, 17, 2)), list(range(1, 17, 2))], True)},
    3: {"3-proc": ([list(range(0, 17, 3)), [1, 4, 7], [2, 5, 8, 10, 11, 13, 14, 16]], False),
        "3-proc-one-empty": ([list(range(16)), [16], []], False)},
}


@pytest.fixture(scope="module", params=sorted(CASES), ids=lambda world: f"{world}-proc")
def distributed(request, tmp_path_factory):
    """Rank 0's results of every case of one world size, from one spawn."""
    world, cases = request.param, CASES[request.param]
    for shares, _ in cases.values():
        assert len(shares) == world and sorted(i for share in shares for i in share) == list(range(NUM_SAMPLES))
    out = tmp_path_factory.mktemp("ddp") / "rank0.pt"
    mp.spawn(_worker, args=(world, free_port(), cases, out), nprocs=world, join=True)
    return world, torch.load(out, weights_only=True)


def test_ddp_equals_single_process(distributed):
    """Split unevenly (one process may get nothing), with and without queries: one process's numbers."""
    world, results = distributed
    for name, (_, queries) in CASES[world].items():
        g, c, native, recognition = evaluate(list(range(NUM_SAMPLES)), batch_size=4, queries=queries)
        if queries:
            assert int(g["pairs"][-1]) == 0 and int(g["pairs"].sum()) > 0, name  # no query of the last finding
        assert_same(dict(g.items()), results[name]["g"])
        assert_same(dict(c.items()), results[name]["c"])
        assert native.keys() == results[name]["native"].keys() and sum(v["pairs"] for v in native.values()) > 0
        for key, values in native.items():  # rows gathered in another order: means to rounding
            assert results[name]["native"][key] == pytest.approx(values, abs=1e-12), (name, key)
        # the stated-vs-denied sentence AUROC and its interval, whatever order the rows were gathered in
        assert results[name]["sentences"] == recognition, name
        assert recognition["per_finding"]["a"]["stated_sentences"] > 0 < recognition["per_finding"]["a"]["denied_sentences"]


COLLECTIVES = ("barrier", "broadcast", "all_reduce", "all_gather", "all_gather_object", "gather", "reduce")


def count_collectives(rank):
    """Each metric of a 21-class run, fed different amounts per process, counts the collectives
    its ``compute`` makes."""
    classes, batch = 21, 3 + 2 * rank
    generator = torch.Generator().manual_seed(rank)
    s = torch.rand(batch, classes, 6, 6, generator=generator)
    s = (s - s.amin((2, 3), keepdim=True)) / (s.amax((2, 3), keepdim=True) - s.amin((2, 3), keepdim=True))
    masks = torch.rand(batch, classes, 6, 6, generator=generator) < 0.5
    has = torch.rand(batch, classes, generator=generator) < 0.3
    index = torch.arange(batch) + 100 * rank
    grounding, classification = GroundingMetrics(classes), ClassificationMetrics(classes)
    grounding.update(s, masks, has, index)
    classification.update(torch.randn(batch, classes, generator=generator), (has * 1).long(), index)
    counts = {}
    for name, metric in (("grounding", grounding), ("classification", classification)):
        calls = []
        originals = {fn: getattr(dist, fn) for fn in COLLECTIVES}
        for fn, original in originals.items():
            setattr(dist, fn, lambda *a, _fn=fn, _original=original, **k: calls.append(_fn) or _original(*a, **k))
        try:
            metric.compute()
        finally:
            for fn, original in originals.items():
                setattr(dist, fn, original)
        counts[name] = calls
    return counts


def test_end_of_run_sync_makes_one_collective_per_dtype(distributed):
    """torchmetrics syncs each state on its own (a barrier and two all-gathers: 51 collectives for
    the grounding metric's 17 states, 9 for classification's 3). The packed sync sends the sum states
    of a dtype together (int64, float64) and the records as their row counts plus one tensor per
    dtype (grounding: int64, float64, int32; classification: int64, float32, int8), on 2 processes
    and on 3."""
    _, results = distributed
    assert results["collectives"]["grounding"] == ["all_gather"] * 6
    assert results["collectives"]["classification"] == ["all_gather"] * 4
