"""Free-text grounding queries (phrase grounding): the record a phrase dataset gives each image,
and the per-slot fields of the batch's query axis (``xbench.data.base`` describes the batch)."""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

import torch

from xbench.data.regions import Region


@dataclass(frozen=True)
class Query:
    """A free-text grounding query on one image: a report phrase, the finding it describes (a
    canonical key) and the region the radiologist drew for it (all its boxes, as one region).

    A denied finding (``asserted=False``: a report's negative sentence, "No pleural effusion.") has
    no region and is never graded for grounding; its phrase's score on the image is recorded, to
    separate the finding's stated sentences from its denied ones (`xbench.metrics.phrases`)."""

    text: str
    finding: str
    region: Region | None
    asserted: bool = True


def query_fields(queries: Sequence[Query], classes: list[str], phrase_row: dict[str, int], slots: int) -> dict:
    """A sample's ``query_class`` and ``query_phrase`` over ``slots`` slots (-1 where unused) and
    ``query_asserted`` (False for a denied finding and an unused slot)."""
    query_class = torch.full((slots,), -1, dtype=torch.int64)
    query_phrase = torch.full((slots,), -1, dtype=torch.int64)
    query_asserted = torch.zeros(slots, dtype=torch.bool)
    for slot, query in enumerate(queries):
        query_class[slot], query_phrase[slot] = classes.index(query.finding), phrase_row[query.text]
        query_asserted[slot] = query.asserted
    return {"query_class": query_class, "query_phrase": query_phrase, "query_asserted": query_asserted}
