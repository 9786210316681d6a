"""ChestX-Det10 (Deepwise AI Lab): ``test.json`` / ``train.json`` + ``test_data/*.png``.

The JSON is a list of ``{"file_name", "syms", "boxes"}``; ``boxes`` are integer ``[x1, y1, x2, y2]``
in the 1024x1024 PNG grid, aligned with ``syms``. An entry with empty ``syms`` is a negative
image. A class's mask is the union of its boxes (filled half-open, as the reference code does).
"""

from __future__ import annotations

import math
import os
from collections import defaultdict
from typing import Literal

from xbench.files import ANNOTATIONS_CAP, read_json
from xbench.data.base import Sample, XBenchDataModule
from xbench.data.regions import Boxes
from xbench.findings import finding_key


class ChestXDet10(XBenchDataModule):
    """ChestX-Det10 boxes; ``split="test"`` (542 images) is the benchmark split."""

    name = "chestx_det10"

    def __init__(self, root: str, split: Literal["test", "train"] = "test", **kwargs) -> None:
        super().__init__(root=root, **kwargs)
        self.split = split

    def index(self) -> list[Sample]:
        annotations = self.require(self.root / f"{self.split}.json", f"the annotation file {self.split}.json")
        image_dir = self.require(self.root / f"{self.split}_data", f"the image folder {self.split}_data/")
        entries = read_json(annotations, ANNOTATIONS_CAP)
        if not isinstance(entries, list):
            raise ValueError(f"{annotations}: expected a JSON list of images, got {type(entries).__name__}")
        present = set(os.listdir(image_dir))
        spelling_set = self.vocabulary_name()  # a subclass may state its own spellings (a dict)
        samples = []
        for row, entry in enumerate(entries):
            where = f"{annotations}, entry {row}"
            try:
                file_name, syms, boxes = entry["file_name"], entry["syms"], entry["boxes"]
            except (KeyError, TypeError) as error:
                raise ValueError(f"{where}: expected keys file_name, syms, boxes ({error!r})") from None
            if not isinstance(syms, list) or not isinstance(boxes, list):
                raise ValueError(f"{where}: syms and boxes must be lists; got {type(syms).__name__} and "
                                 f"{type(boxes).__name__}")
            if len(syms) != len(boxes):
                raise ValueError(f"{where}: {len(syms)} syms but {len(boxes)} boxes")
            if file_name not in present:
                raise FileNotFoundError(
                    f"{where}: image {file_name} not found in {image_dir}. Extract {self.split}_data.zip "
                    f"into {self.root}."
                )
            by_class: dict[str, list] = defaultdict(list)
            for sym, box in zip(syms, boxes):
                key = finding_key(spelling_set, sym, source=where)
                if not isinstance(box, list) or len(box) != 4 or not all(type(v) in (int, float) for v in box) \
                        or not all(map(math.isfinite, box)) or not (box[2] > box[0] and box[3] > box[1]):
                    raise ValueError(f"{where}: box {box} for {sym!r} is not [x1, y1, x2, y2] of finite numbers with "
                                     "x2 > x1, y2 > y1; correct the entry")
                by_class[key].append(tuple(float(v) for v in box))
            samples.append(
                Sample(
                    image_id=file_name,
                    path=image_dir / file_name,
                    labels={key: int(key in by_class) for key in self.supported_classes()},
                    regions={key: Boxes(tuple(found)) for key, found in by_class.items()},
                )
            )
        return samples
