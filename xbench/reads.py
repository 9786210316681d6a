"""A read: one radiologist's reading of one radiograph, the sample of a split scored reader by reader.

Where several radiologists read each image (VinDr-CXR's training split, REFLACX's multi-read
images), a split may hold one sample per read, each with its own reference (the other readers).
The reads of one radiograph are not independent: intervals resample radiographs, each with all its
reads. The sample id of a read names both, ``<image_id>#<reader>``; this module is the one place
that rule lives (the data writes it, the analysis reads it back).
"""

from __future__ import annotations

READ_SEPARATOR = "#"


def read_id(image_id: str, reader: str) -> str:
    """The sample id of ``reader``'s read of ``image_id``."""
    if READ_SEPARATOR in image_id or READ_SEPARATOR in reader:
        raise ValueError(f"an image id or reader id holds {READ_SEPARATOR!r}, which separates them in a read's id: "
                         f"{image_id!r}, {reader!r}")
    return f"{image_id}{READ_SEPARATOR}{reader}"


def radiograph_of(sample_id: str) -> str:
    """The radiograph a read's sample id names (the id itself when it is not a read's)."""
    return sample_id.split(READ_SEPARATOR, 1)[0]
