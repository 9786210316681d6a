"""Phrase grounding's intervals and its paired question: does the model use the report's words?

A phrase dataset's (image, query) pairs are scored twice by a phrase-mode model: by the map of the
report phrase and by the map of the phrase's finding name, against the same region. Per finding
and as a macro mean over findings, this gives Pointing Game, Dice and IoU at tau = 0.5 and CNR for
both, with bootstrap percentile intervals over images, and their paired difference (phrase minus
name, the same replicates for both, so the interval is that of the difference itself).

A dataset whose reports also deny findings (PadChest-GR's negative sentences: queries with
``asserted=False``, never graded) asks a second question: does a phrase's score separate the
sentences that state a finding from those that deny it? Each query's score on its image -- the
logit of its phrase for a phrase-mode model, of its finding for a finding-mode one -- is recorded
(`SentenceScores`), and per finding the AUROC of the stated against the denied sentences is
computed with an interval (`sentence_recognition`), by the recognition kernel the analysis uses.

The replicates are those of `xbench.metrics.bootstrap` over the run's images in the order
of their sorted ids (the analysis's convention), from the stream (seed, dataset, ``"test"``): a
sentence is resampled with its image. The end of a phrase run computes them for ``metrics.json``;
``xbench.analyze --queries`` reads the same pairs back from ``queries.csv.gz``.
"""

from __future__ import annotations

from collections.abc import Sequence

import numpy as np
import torch
from torch import Tensor
from torchmetrics.utilities import dim_zero_cat

from xbench.metrics.bootstrap import (
    CONFIDENCE, REPLICATES, SEED, paired_difference, percentile_interval, random_stream, resample_weights,
)
from xbench.metrics.common import RecordsMetric
from xbench.metrics.grounding import FIXED_TAU_INDEX, pair_scores
from xbench.metrics.recognition import IGNORE, recognition_statistics

#: The per-pair metrics a phrase run reports with intervals (each a mean over the finding's pairs).
PHRASE_METRICS = ("pointing_game", "dice@0.5", "iou@0.5", "cnr")


def pair_values(records: dict[str, Tensor]) -> Tensor:
    """float64 [P, 4]: each graded pair's hit, Dice and IoU at tau = 0.5 and CNR (NaN: undefined)."""
    dice, iou = pair_scores(records["predicted"], records["inter"])
    return torch.stack([records["hit"].double(), dice[:, FIXED_TAU_INDEX], iou[:, FIXED_TAU_INDEX],
                        records["cnr"].double()], dim=1)


def finding_means(values: Tensor, image_row: Tensor, finding: Tensor, weights: Tensor, num_findings: int) -> Tensor:
    """[R + 1, F, M]: per replicate and finding, the weighted mean of each metric over the
    finding's pairs where it is defined (NaN where none is)."""
    pairs, metrics = values.shape
    one_hot = torch.nn.functional.one_hot(finding, num_findings).double().unsqueeze(2)  # [P, F, 1]
    columns = torch.cat([one_hot * values.nan_to_num(0.0).unsqueeze(1), one_hot * (~values.isnan()).unsqueeze(1)], 2)
    sums = (weights[:, image_row] @ columns.reshape(pairs, -1)).view(-1, num_findings, 2 * metrics)  # one product
    totals, counts = sums[..., :metrics], sums[..., metrics:]
    return torch.where(counts > 0, totals / counts.clamp(min=1e-300), float("nan"))


def _json(interval: dict[str, Tensor], index: tuple = ()) -> dict[str, float | None]:
    out = {}
    for key in ("estimate", "lower", "upper"):
        value = float(interval[key][index])
        out[key] = None if np.isnan(value) else value
    if "a_better" in interval:
        value = float(interval["a_better"][index])
        out["p_phrase_better"] = None if np.isnan(value) else value
    return out


def _report(statistic: dict[str, Tensor], findings: Sequence[str]) -> dict:
    """{metric: {"macro": interval, "per_finding": {key: interval}}} from [M]- and [F, M]-shaped intervals."""
    return {
        metric: {
            "macro": _json(statistic["macro"], (m,)),
            "per_finding": {key: _json(statistic["per_finding"], (f, m)) for f, key in enumerate(findings)},
        }
        for m, metric in enumerate(PHRASE_METRICS)
    }


def _image_weights(image_ids: Sequence[str], evaluated: Tensor, dataset: str, replicates: int,
                   seed: int) -> tuple[Tensor, Tensor]:
    """Each evaluated sample index's row among the images sorted by id (-1: not evaluated), and the
    images' bootstrap weights [R + 1, N] from the stream (seed, dataset, ``"test"``)."""
    evaluated = evaluated.cpu()
    ids = np.asarray(image_ids, dtype=object)[evaluated.numpy()]
    order = np.argsort(ids.astype(str), kind="stable")
    row_of = torch.full((int(evaluated.max()) + 1 if len(evaluated) else 1,), -1, dtype=torch.int64)
    row_of[evaluated[torch.from_numpy(order)]] = torch.arange(len(order))
    return row_of, resample_weights(len(order), replicates, random_stream(seed, dataset, "test"))


def phrase_intervals(query_records: dict[str, Tensor], name_records: dict[str, Tensor] | None,
                     image_ids: Sequence[str], evaluated: Tensor, findings: Sequence[str], dataset: str,
                     replicates: int = REPLICATES, confidence: float = CONFIDENCE, seed: int = SEED) -> dict:
    """Intervals of the query view (and the finding-name view and phrase minus name, where there
    is one) for a run whose ``evaluated`` sample indices name images in ``image_ids``."""
    row_of, weights = _image_weights(image_ids, evaluated, dataset, replicates, seed)

    def means(records: dict[str, Tensor]) -> tuple[Tensor, Tensor]:
        records = {name: value.cpu() for name, value in records.items()}
        per_finding = finding_means(pair_values(records), row_of[records["index"]], records["class"], weights,
                                    len(findings))
        return per_finding, per_finding.nanmean(dim=1)  # the macro mean over findings with a pair

    query_per_finding, query_macro = means(query_records)
    out = {"replicates": replicates, "confidence": confidence, "by_query": _report(
        {"per_finding": percentile_interval(query_per_finding, confidence),
         "macro": percentile_interval(query_macro, confidence)}, findings)}
    if name_records is not None:
        name_per_finding, name_macro = means(name_records)
        out["by_finding_name"] = _report(
            {"per_finding": percentile_interval(name_per_finding, confidence),
             "macro": percentile_interval(name_macro, confidence)}, findings)
        out["phrase_minus_name"] = _report(
            {"per_finding": paired_difference(query_per_finding, name_per_finding, confidence),
             "macro": paired_difference(query_macro, name_macro, confidence)}, findings)
    return out


class SentenceScores(RecordsMetric):
    """Each query's score on its image, stated or denied: one row per used query slot.

    ``update(index [B], query_class [B, Q], query_asserted [B, Q], scores [B, Q])``; slots with
    ``query_class`` -1 are unused and left out."""

    full_state_update = False
    is_differentiable = False

    def __init__(self, **kwargs) -> None:
        super().__init__(**kwargs)
        self._add_record_states()

    def record_layout(self) -> dict[str, tuple[tuple[int, ...], torch.dtype]]:
        return {"sentence_index": ((), torch.int64), "sentence_class": ((), torch.int64),
                "sentence_asserted": ((), torch.int8), "sentence_score": ((), torch.float32)}

    def update(self, index: Tensor, query_class: Tensor, query_asserted: Tensor, scores: Tensor) -> None:
        used = query_class >= 0
        self.sentence_index.append(index[:, None].expand_as(query_class)[used].long())
        self.sentence_class.append(query_class[used].long())
        self.sentence_asserted.append(query_asserted[used].to(torch.int8))
        self.sentence_score.append(scores.detach()[used].float())

    def compute(self) -> dict[str, Tensor]:
        """The rows: ``index``, ``class``, ``asserted`` (int64) and ``score`` (float32)."""
        return {name: dim_zero_cat(getattr(self, f"sentence_{name}")) for name in ("index", "class", "asserted", "score")}


def sentence_recognition(records: dict[str, Tensor], image_ids: Sequence[str], evaluated: Tensor,
                         findings: Sequence[str], dataset: str, replicates: int = REPLICATES,
                         confidence: float = CONFIDENCE, seed: int = SEED) -> dict:
    """Per finding, the AUROC of its stated sentences' scores against its denied ones' (each on its
    own image; ties count half; NaN where a finding lacks either kind), with the percentile
    interval over image resamples, and how many sentences of each kind stand behind it."""
    records = {name: value.cpu() for name, value in records.items()}
    row_of, weights = _image_weights(image_ids, evaluated, dataset, replicates, seed)
    rows, finding = len(records["index"]), records["class"]
    labels = torch.full((rows, len(findings)), IGNORE, dtype=torch.int64)
    labels[torch.arange(rows), finding] = records["asserted"].long()
    logits = torch.zeros(rows, len(findings), dtype=torch.float64)
    logits[torch.arange(rows), finding] = records["score"].double()
    auroc = percentile_interval(recognition_statistics(labels, logits, weights[:, row_of[records["index"]]])["auroc"],
                                confidence)
    stated = torch.bincount(finding[records["asserted"] == 1], minlength=len(findings))
    denied = torch.bincount(finding[records["asserted"] == 0], minlength=len(findings))
    return {"replicates": replicates, "confidence": confidence, "per_finding": {
        key: {"auroc": _json(auroc, (f,)), "stated_sentences": int(stated[f]), "denied_sentences": int(denied[f])}
        for f, key in enumerate(findings)}}
