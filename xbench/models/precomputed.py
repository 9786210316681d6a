"""Score saliency maps and boxes that another program saved: a model that reads instead of running.

``PrecomputedSaliency(path, layout)`` reads, for every (image, finding) pair of the datamodule, a
score and a map covering the whole native image, from one of four layouts (``image_id`` as in the
dataset's own files, findings as canonical keys from ``xbench.findings``):

- ``per_image``: ``<path>/<image_id>.npz`` or ``.safetensors`` holding ``maps`` [C, h, w] and
  ``logits`` or ``probs`` [C], in the dataset's class order, or in the order of ``classes`` (an
  array of finding keys in an ``.npz``; a JSON list under ``classes`` in a ``.safetensors``'
  metadata). Optional ``window`` [4] (top, left, height, width in native pixels: the part of the
  image the maps cover) with ``image_size`` [2] (native height, width).
- ``per_pair``: ``<path>/<image_id>/<finding>.npz`` or ``.safetensors`` holding ``map`` [h, w]
  and ``logit`` or ``prob`` (a scalar), with the same optional ``window`` and ``image_size``.
- ``chexlocalize``: cheXlocalize's pickles, ``<path>/<cxr_id>_<Pathology>_map.pkl`` holding
  ``map`` [1, 1, h, w], ``prob`` and ``cxr_dims`` (width, height); read by
  `DataUnpickler`, which runs nothing a file names.
- ``boxes``: ``<path>`` is a JSON Lines file, one line per pair: ``{"image_id", "finding",
  "image_size": [height, width], "boxes": [[x1, y1, x2, y2], ...] (native pixels), "scores":
  [...] (optional, one per box, default 1), "logit" or "prob"}``. The map is the score-weighted
  union of the boxes: each pixel takes the highest score of the boxes that contain its centre, 0
  outside every box (no boxes: a constant map, a Pointing Game miss).

Probabilities become logits as ``log(p / (1 - p))`` with ``p`` clamped to [1e-7, 1 - 1e-7].
A map is read in float32, or in float64 where it was saved so; the metric frame is float32, so a
float64 map is min-max normalised in float64 and then rounded to float32 before it is placed
([`as_float32`][xbench.geometry.maps.as_float32]; docs/saved-outputs.md: the measured effect).
Each map is resized onto the metric frame (the whole image squashed to S x S) bilinearly
(``align_corners=False``), or, where the file states a window, placed into the frame through it
([`place_in_frame`][xbench.geometry.maps.place_in_frame]); maps of different sizes in one batch
therefore arrive as one [B, C, S, S] tensor. A pair without a file or line is an error at setup
naming the first missing ones and their count; with ``missing="skip"`` such pairs leave both metrics
(their label is treated as unknown and their mask as absent) and their number is written to the
results under ``precomputed.missing_pairs``.

With ``native_protocol=True`` the run also scores every pair with a region at the image's native
size by cheXlocalize's protocol (`xbench.metrics.native`) and writes per-class means under
``precomputed.chexlocalize_protocol`` in ``metrics.json``, and each pair's row to the results
folder's ``chexlocalize_pairs.csv.gz`` (what the report's cheXlocalize percentage decrease reads):
extra, separately labelled values beside XBench's, which they never replace, with the pairs their
``eval.py`` leaves out counted. The native
size comes from the saved file (``image_size``, a pickle's ``cxr_dims``, a box line's
``image_size``) or else from the batch's ``native_size``; a float64 map stays float64 for
cheXlocalize's binarisations, as in their code. Each pair is scored in the test step, where its
image's batch is, so under DDP each process scores its own samples.
"""

from __future__ import annotations

import json
import math
import warnings
from contextlib import contextmanager
from dataclasses import dataclass
from functools import partial
from pathlib import Path
from typing import ClassVar, Literal

import numpy as np
import torch
from safetensors import safe_open
from torch import Tensor

from xbench.files import open_text, present, regular_file
from xbench.findings import finding_key
from xbench.metrics.native import ChexlocalizeRecords, chexlocalize_means, chexlocalize_records, model_row
from xbench.models.base import XBenchModel
from xbench.models.safe_pickle import load_data_pickle
from xbench.geometry.image import aspect_matches
from xbench.geometry.maps import as_float32, place_in_frame, whole_frame

Layout = Literal["per_image", "per_pair", "chexlocalize", "boxes"]
PROBABILITY_CLAMP = 1e-7
INTEGER_DTYPES = (torch.uint8, torch.int8, torch.int16, torch.int32, torch.int64, torch.bool)
#: Order of a 14-entry ``prob`` tensor in a cheXlocalize pickle (their CheXpert task order).
CHEXPERT_14 = (
    "No Finding", "Enlarged Cardiomediastinum", "Cardiomegaly", "Lung Lesion", "Airspace Opacity", "Edema",
    "Consolidation", "Pneumonia", "Atelectasis", "Pneumothorax", "Pleural Effusion", "Pleural Other", "Fracture",
    "Support Devices",
)


@dataclass(frozen=True)
class SavedPair:
    """One pair as read from disk: the raw map over the whole image (or over ``window`` of an image
    of ``image_size``, both in native pixels) and the logit."""

    map: Tensor
    logit: float
    window: tuple[float, float, float, float] | None = None
    image_size: tuple[int, int] | None = None


def probability_logit(probability: float) -> float:
    p = min(max(float(probability), PROBABILITY_CLAMP), 1 - PROBABILITY_CLAMP)
    return math.log(p / (1 - p))


def native_window_in_frame(
    window: tuple[float, float, float, float], image_size: tuple[int, int], frame: tuple[int, int]
) -> Tensor:
    """A window (top, left, height, width) in native pixels of an image of ``image_size`` (height,
    width) -> the same window in pixels of the frame, the whole image squashed to ``frame``, as the
    one-row window tensor [1, 4] that [`place_in_frame`][xbench.geometry.maps.place_in_frame]
    takes."""
    top, left, height, width = window
    rows, columns = frame[0] / image_size[0], frame[1] / image_size[1]
    return torch.tensor([[top * rows, left * columns, height * rows, width * columns]])


def box_map(
    boxes: list, scores: list | None, image_size: tuple[int, int], frame: tuple[int, int]
) -> Tensor:
    """The score-weighted union of boxes [x1, y1, x2, y2] (native pixels) on the frame's pixels.

    A frame pixel takes the highest score of the boxes containing its centre (mapped to native
    coordinates), 0 where none does: the same map as drawing at native size and sampling it at
    the frame's pixel centres.
    """
    height, width = image_size
    ys = (torch.arange(frame[0], dtype=torch.float64) + 0.5) * height / frame[0]
    xs = (torch.arange(frame[1], dtype=torch.float64) + 0.5) * width / frame[1]
    result = torch.zeros(frame, dtype=torch.float32)
    for (x1, y1, x2, y2), score in zip(boxes, scores if scores is not None else [1.0] * len(boxes)):
        inside = ((ys >= y1) & (ys < y2))[:, None] & ((xs >= x1) & (xs < x2))[None, :]
        result = torch.where(inside, torch.maximum(result, torch.tensor(float(score))), result)
    return result


class PrecomputedSaliency(XBenchModel):
    """Saved maps (or boxes) and scores of any model, scored like a live one.

    Args:
        path: the folder of saved files (``per_image``, ``per_pair``, ``chexlocalize``) or the
            JSON Lines file (``boxes``).
        layout: how the files are laid out (see the module docstring).
        missing: ``error`` (default) or ``skip`` pairs that have no saved map or score.
        native_protocol: also score cheXlocalize's protocol at native size (see the module docstring).
        native_threshold: its fixed binarisation threshold (``s > t``), one for all findings or one
            per finding key (thresholds chosen on a validation split, as cheXlocalize's tuning CSV).
    """

    #: Maps are read, not computed from an input: no model input is built for this model.
    preprocess: ClassVar[None] = None

    def __init__(self, path: str, layout: Layout = "per_image", missing: Literal["error", "skip"] = "error",
                 native_protocol: bool = False, native_threshold: float | dict[str, float] = 0.5, **kwargs) -> None:
        super().__init__(**kwargs)
        if layout not in ("per_image", "per_pair", "chexlocalize", "boxes"):
            raise ValueError(f"layout must be per_image, per_pair, chexlocalize or boxes; got {layout!r}")
        if missing not in ("error", "skip"):
            raise ValueError(f"missing must be 'error' or 'skip'; got {missing!r}")
        self.path = Path(path)
        self.layout = layout
        self.missing = missing
        self.native_protocol = native_protocol
        self.native_threshold = native_threshold
        self.missing_pairs: set[tuple[str, str]] = set()
        self._pickles: dict[tuple[str, str], Path] | None = None
        self._last_file: tuple[Path, dict[str, Tensor], list[str] | None] | None = None
        self._file_classes: dict[Path, set[str]] = {}  # per-image file -> the findings it holds
        self._lines: dict[tuple[str, str], dict] = {}  # boxes layout: (image_id, finding) -> line
        self.chexlocalize_records: ChexlocalizeRecords | None = None

    # -- setup: find every pair's file before the first batch ----------------------------------

    def build(self, classes: list[str]) -> None:
        self.find_pairs(self.trainer.datamodule.samples, classes)
        self.chexlocalize_records = None
        if self.native_protocol:
            self.check_native_threshold(classes)
            self.chexlocalize_records = ChexlocalizeRecords(len(classes))

    def check_native_threshold(self, classes: list[str]) -> None:
        """One threshold in [0, 1) for every finding of the run: a finding without one has no
        segmentation, and at 1 or above every segmentation is empty (each pair left out)."""
        per_finding = isinstance(self.native_threshold, dict)
        given = self.native_threshold if per_finding else {"": self.native_threshold}
        lacking = [key for key in classes if key not in given] if per_finding else []
        if lacking:
            raise ValueError(f"--model.native_threshold has no threshold for {lacking}; give one per finding of the "
                             f"run ({', '.join(classes)}) or one number for all")
        for key, value in given.items():
            if not (isinstance(value, (int, float)) and 0 <= value < 1):
                raise ValueError(f"--model.native_threshold{f' for {key}' if key else ''} is {value!r}; a threshold "
                                 "on the normalised map lies in [0, 1)")

    def run_metrics(self) -> list:
        return [*super().run_metrics(), *([self.chexlocalize_records] if self.native_protocol else [])]

    def find_pairs(self, samples: list, classes: list[str]) -> None:
        """Find the saved output of every (image, finding) pair of ``samples`` (the datamodule's)
        and ``classes``."""
        if not self.path.exists():
            raise FileNotFoundError(f"PrecomputedSaliency: {self.path} does not exist (the saved {self.layout} files)")
        self.classes = list(classes)
        self._file_classes, self._pickles, self._last_file = {}, None, None
        self._lines = _read_box_lines(self.path) if self.layout == "boxes" else {}
        image_ids = [sample.image_id for sample in samples]
        missing = [(image_id, key) for image_id in image_ids for key in classes if not self._has(image_id, key)]
        if missing and self.missing == "error":
            shown = ", ".join(f"({i}, {k})" for i, k in missing[:5])
            raise FileNotFoundError(
                f"PrecomputedSaliency: {len(missing)} of {len(image_ids) * len(classes)} (image, finding) pairs have "
                f"no saved map or score under {self.path} ({self.layout} layout), first: {shown}. Save them, or "
                "pass --model.missing skip to leave them out (counted in the results)."
            )
        self.missing_pairs = set(missing)
        unused = {finding for _, finding in self._lines} - set(classes)
        if unused:
            warnings.warn(f"PrecomputedSaliency: {self.path} has lines for findings outside this run's classes, "
                          f"not scored: {sorted(unused)}", stacklevel=2)
        if missing:
            warnings.warn(f"PrecomputedSaliency: {len(missing)} pairs have no saved output and are skipped",
                          stacklevel=2)

    def _has(self, image_id: str, key: str) -> bool:
        if self.layout == "boxes":
            return (image_id, key) in self._lines
        if self.layout == "per_pair":
            return any(present(self.path / image_id / f"{key}{ext}") for ext in (".npz", ".safetensors"))
        if self.layout == "chexlocalize":
            return self._pickle_path(image_id, key) is not None
        file = self._image_file(image_id)
        if file is None:
            return False
        if file not in self._file_classes:
            self._file_classes[file] = set(_file_classes(file, self.classes))
        return key in self._file_classes[file]

    def _image_file(self, image_id: str) -> Path | None:
        for ext in (".npz", ".safetensors"):
            if present(self.path / f"{image_id}{ext}"):
                return self.path / f"{image_id}{ext}"
        return None

    def _pickle_path(self, image_id: str, key: str) -> Path | None:
        """cheXlocalize names files by its own pathology spelling; any spelling of ``key`` is taken."""
        if self._pickles is None:
            self._pickles = {}
            for file in self.path.glob("*_map.pkl"):
                stem = file.name.removesuffix("_map.pkl")
                cxr_id, _, pathology = stem.rpartition("_")
                self._pickles[(cxr_id, finding_key("chexlocalize", pathology, source=str(file)))] = file
        return self._pickles.get((image_id, key))

    # -- reading -------------------------------------------------------------------------------

    def read_pair(self, image_id: str, key: str, native_size: tuple[int, int] | None = None) -> SavedPair:
        """The saved map and logit of one pair (the pair must exist), checked: exact shapes, finite
        values, a window inside a positive image size of the aspect of the image's ``native_size``
        (the batch's; ``None`` outside a run: not checked)."""
        if self.layout == "chexlocalize":
            file = self._pickle_path(image_id, key)
            pair = _chexlocalize_pair(load_data_pickle(file), file)
        elif self.layout == "per_pair":
            file = next(f for f in (self.path / image_id / f"{key}{ext}" for ext in (".npz", ".safetensors"))
                        if present(f))
            arrays, _ = _read_arrays(file)
            where = f"{file} ({image_id}, {key})"
            pair = SavedPair(_map(arrays, "map", (), where), _logit(arrays, "logit", "prob", (), where),
                             *_window(arrays, where))
        else:
            file = self._image_file(image_id)
            if self._last_file is None or self._last_file[0] != file:  # one read per image for all its classes
                arrays, names = _read_arrays(file)
                self._last_file = (file, arrays, _check_per_image(arrays, names or self.classes, file))
            _, arrays, names = self._last_file
            c = names.index(key)
            where = f"{file} ({image_id}, {key})"
            pair = SavedPair(_map(arrays, "maps", (c,), where), _logit(arrays, "logits", "probs", (c,), where),
                             *_window(arrays, where))
        if pair.image_size is not None:
            _check_image_size(pair.image_size, native_size, f"{file} ({image_id}, {key})")
        return pair

    def frame_map(self, image_id: str, key: str, frame: tuple[int, int], native_size: tuple[int, int] | None = None,
                  pair: SavedPair | None = None) -> tuple[Tensor, float]:
        """One pair's map on the frame's pixels [*frame] and its logit (``native_size``: as
        [`read_pair`][xbench.models.precomputed.PrecomputedSaliency.read_pair]; ``pair``: the pair
        already read, else it is read here)."""
        if self.layout == "boxes":
            line = self._lines[(image_id, key)]
            _check_image_size(line["image_size"], native_size, line["where"])
            return box_map(line["boxes"], line.get("scores"), line["image_size"], frame), line["logit"]
        if pair is None:
            pair = self.read_pair(image_id, key, native_size)
        raw = as_float32(pair.map[None, None])
        if pair.window is None:
            window = whole_frame(1, frame, raw.device)
        else:
            window = native_window_in_frame(pair.window, pair.image_size, frame)
        placed = place_in_frame(raw, window, frame)
        return placed[0, 0], pair.logit

    def infer(self, batch: dict) -> tuple[Tensor, Tensor]:
        """Reads each pair's saved output; a skipped pair gets a zero map and logit and is taken out
        of the batch's labels and masks, so neither metric sees it. With ``native_protocol``, also
        scores each pair with a region by cheXlocalize's protocol."""
        frame = tuple(batch["masks"].shape[-2:])
        samples = self.trainer.datamodule.samples
        logits = torch.zeros(len(batch["image_id"]), len(self.classes))
        maps = torch.zeros(len(batch["image_id"]), len(self.classes), *frame)
        sizes, rows = batch["native_size"].tolist(), batch["index"].tolist()  # one device sync each
        for b, image_id in enumerate(batch["image_id"]):
            native_size, sample = tuple(sizes[b]), samples[rows[b]]
            for c, key in enumerate(self.classes):
                if (image_id, key) in self.missing_pairs:
                    batch["labels"][b, c] = -1
                    batch["has_mask"][b, c] = False
                    continue
                pair = None if self.layout == "boxes" else self.read_pair(image_id, key, native_size)  # read once
                maps[b, c], logits[b, c] = self.frame_map(image_id, key, frame, native_size, pair)
                if self.native_protocol and key in sample.regions:
                    raw, mask = self.native_pair(sample, key, native_size, pair)
                    self.chexlocalize_records.update(mask, c, rows[b], partial(model_row, raw, mask,
                                                                               self.fixed_threshold(key)))
        device = batch["masks"].device
        return logits.to(device), maps.to(device)


    # -- results --------------------------------------------------------------------------------

    def extra_results(self) -> dict:
        section: dict = {"layout": self.layout, "missing_pairs": len(self.missing_pairs)}
        if self.native_protocol:
            section["chexlocalize_protocol"] = {
                "native_threshold": self.native_threshold,
                "per_class": chexlocalize_means(self.chexlocalize_records.compute(), self.classes)}
        return {"precomputed": section}

    def extra_records(self) -> dict:
        return {"chexlocalize": chexlocalize_records(self.chexlocalize_records.compute())} if self.native_protocol else {}

    def fixed_threshold(self, key: str) -> float:
        """cheXlocalize's fixed threshold for finding ``key``: one for all, or the finding's own."""
        return self.native_threshold[key] if isinstance(self.native_threshold, dict) else self.native_threshold

    def native_pair(self, sample, key: str, native_size: tuple[int, int], pair: SavedPair | None = None
                    ) -> tuple[Tensor, Tensor]:
        """One pair's raw map over the whole image at its native size (the saved file's, else the
        image's ``native_size``) and its mask drawn there (``pair``: as in ``frame_map``)."""
        if self.layout == "boxes":
            line = self._lines[(sample.image_id, key)]
            image_size = line["image_size"]
            raw = box_map(line["boxes"], line["scores"], image_size, image_size)
        else:
            if pair is None:
                pair = self.read_pair(sample.image_id, key)
            image_size = pair.image_size or native_size
            raw = pair.map
            if pair.window is not None:
                raw = place_in_frame(raw[None, None], native_window_in_frame(pair.window, image_size, image_size),
                                     image_size)[0, 0]
        mask, _ = sample.regions[key].to_mask(*image_size)
        return raw, torch.from_numpy(mask)


def _check_image_size(stated: tuple[int, int], actual: tuple[int, int] | None, where: str) -> None:
    """A stated native size must have the aspect of the image's ``actual`` size (within rounding: a
    resized copy's size is fine): ``[width, height]`` for ``[height, width]`` would stretch the map.
    ``None``: read outside a run, no image to compare with."""
    if actual is None or aspect_matches(stated, actual):
        return
    reversed_hint = (" (it reads as [width, height]: write [height, width])"
                     if aspect_matches(stated[::-1], actual) else "")
    raise ValueError(
        f"{where}: the stated image size {list(stated)} (height, width) has another aspect ratio than the "
        f"image, {actual[0]} x {actual[1]} (height x width){reversed_hint}; the saved output would be "
        "stretched unevenly. State the size of the image the output was made on, as [height, width]."
    )


@contextmanager
def _reading(file: Path, kind: str):
    """A file numpy or safetensors cannot read is an error naming it and how to write it."""
    try:
        yield
    except Exception as error:  # noqa: BLE001 -- each library raises its own types for a damaged file
        raise ValueError(
            f"{file} cannot be read as {kind} ({type(error).__name__}: {error}); it may be truncated or not "
            f"{kind} at all. Write it again (numpy.savez or safetensors' save_file)."
        ) from None


def _read_arrays(file: Path) -> tuple[dict[str, Tensor], list[str] | None]:
    """Numeric arrays of an ``.npz`` or ``.safetensors`` file as tensors, and its ``classes`` if stated."""
    regular_file(file)
    if file.suffix == ".npz":
        with _reading(file, "an .npz archive"), np.load(file, allow_pickle=False) as data:
            names = [str(v) for v in data["classes"]] if "classes" in data else None
            arrays = {k: torch.from_numpy(np.asarray(data[k])) for k in data.files if k != "classes"}
    else:
        with _reading(file, "a .safetensors file"), safe_open(file, framework="pt") as data:
            metadata = data.metadata() or {}
            names = json.loads(metadata["classes"]) if "classes" in metadata else None
            arrays = {k: data.get_tensor(k) for k in data.keys()}
    bad = [k for k, v in arrays.items() if not (v.dtype.is_floating_point or v.dtype in INTEGER_DTYPES)]
    if bad:
        raise ValueError(f"{file}: {bad[0]} holds {arrays[bad[0]].dtype} values, not numbers")
    return arrays, names


def _file_classes(file: Path, classes: list[str]) -> list[str]:
    """The findings a per-image file holds: its ``classes`` if stated, else the dataset's."""
    regular_file(file)
    if file.suffix == ".npz":
        with _reading(file, "an .npz archive"), np.load(file, allow_pickle=False) as data:
            return [str(v) for v in data["classes"]] if "classes" in data.files else classes
    with _reading(file, "a .safetensors file"), safe_open(file, framework="pt") as data:
        metadata = data.metadata() or {}
        return json.loads(metadata["classes"]) if "classes" in metadata else classes


def _shape(value: Tensor) -> str:
    return "[" + ", ".join(map(str, value.shape)) + "]"


def _check_per_image(arrays: dict[str, Tensor], names: list[str], file: Path) -> list[str]:
    """A per-image file holds ``maps`` [C, h, w] and ``logits`` or ``probs`` [C], C its classes."""
    if len(set(names)) != len(names):
        raise ValueError(f"{file}: its classes repeat a finding: {names}")
    count = len(names)
    if "maps" not in arrays:
        raise KeyError(f"{file}: no 'maps' array; a per-image file holds maps [C, h, w] (C = {count} classes)")
    maps = arrays["maps"]
    if maps.ndim != 3 or maps.shape[0] != count or 0 in maps.shape:
        raise ValueError(f"{file}: maps has shape {_shape(maps)}; expected [C, h, w] = [{count}, h, w], one map per "
                         f"class ({', '.join(names)}) with h, w >= 1")
    for name in ("logits", "probs"):
        if name in arrays and tuple(arrays[name].shape) != (count,):
            raise ValueError(f"{file}: {name} has shape {_shape(arrays[name])}; expected [{count}], one per class")
    return names


def _map(arrays: dict[str, Tensor], name: str, index: tuple[int, ...], where: str) -> Tensor:
    """``arrays[name][index]`` as an [h, w] map with finite values and a finite spread: float64 as
    saved (cheXlocalize's protocol computes in it), any other type as float32."""
    if name not in arrays:
        raise KeyError(f"{where}: no {name!r} array; save the map [h, w] as {name!r}")
    value = arrays[name][index] if index else arrays[name]
    if value.ndim != 2 or 0 in value.shape:
        raise ValueError(f"{where}: map {name} has shape {_shape(value)}; expected [h, w] with h, w >= 1")
    value = value.double() if value.dtype == torch.float64 else value.float()
    if not torch.isfinite(value).all():
        raise ValueError(f"{where}: the map holds {int((~torch.isfinite(value)).sum())} NaN or infinite values; "
                         "save finite maps")
    if not torch.isfinite(value.amax() - value.amin()):  # min-max normalisation would divide by infinity
        raise ValueError(f"{where}: the map's values span more than {value.dtype} holds (from {value.min().item():.3g} "
                         f"to {value.max().item():.3g}); save the map scaled down")
    return value


def _logit(arrays: dict[str, Tensor], logit_name: str, prob_name: str, index: tuple[int, ...], where: str) -> float:
    """The pair's score: a finite logit, or a probability in [0, 1] as its logit."""
    for name in (logit_name, prob_name):
        if name in arrays:
            value = arrays[name][index] if index else arrays[name]
            if value.numel() != 1 or value.ndim > 1:
                raise ValueError(f"{where}: {name} has shape {_shape(value)}; expected one number")
            return _score(float(value), name, where)
    raise KeyError(f"{where}: no {logit_name!r} or {prob_name!r}; save the model's scores next to its maps")


def _score(value: float, name: str, where: str) -> float:
    if name.startswith("prob"):
        if not 0 <= value <= 1:
            raise ValueError(f"{where}: {name} is {value}; a probability lies in [0, 1]")
        return probability_logit(value)
    if not math.isfinite(value):
        raise ValueError(f"{where}: {name} is {value}; save a finite logit")
    return value


def _image_size(values, where: str, what: str = "image_size [height, width]") -> tuple[int, int]:
    """Two whole, positive numbers of pixels."""
    try:
        numbers = [float(v) for v in values]
    except (TypeError, ValueError):
        numbers = []
    if len(numbers) != 2 or not all(math.isfinite(v) and v >= 1 and v == int(v) for v in numbers):
        raise ValueError(f"{where}: {what} must be two whole numbers of pixels >= 1; got {_listed(values)}")
    return int(numbers[0]), int(numbers[1])


def _listed(values) -> object:
    return values.tolist() if isinstance(values, (Tensor, np.ndarray)) else values


def _window(arrays: dict[str, Tensor], where: str) -> tuple:
    """The optional window (top, left, height, width) in native pixels, and the image size it needs."""
    if "window" not in arrays:
        return None, None
    if "image_size" not in arrays:
        raise KeyError(f"{where}: a window in native pixels needs the native image_size [height, width] beside it")
    window = arrays["window"].double()
    if tuple(window.shape) != (4,) or not torch.isfinite(window).all() or not (window[2:] > 0).all():
        raise ValueError(f"{where}: window must be [top, left, height, width], finite, with height and width > 0; "
                         f"got {_listed(arrays['window'])}")
    if arrays["image_size"].ndim != 1:
        raise ValueError(f"{where}: image_size has shape {_shape(arrays['image_size'])}; expected [2]")
    return tuple(float(v) for v in window), _image_size(arrays["image_size"], where)


def _chexlocalize_pair(info, file: Path) -> SavedPair:
    """One cheXlocalize pickle: ``map`` [1, 1, h, w], ``prob`` (one number or CheXpert's 14 in
    their task order, picked by ``task``) and ``cxr_dims`` (width, height)."""
    if not isinstance(info, dict) or not {"map", "prob", "cxr_dims"} <= set(info):
        raise ValueError(f"{file}: expected cheXlocalize's dict with map, prob and cxr_dims (and task)")
    raw = torch.as_tensor(info["map"])
    if raw.ndim != 4 or tuple(raw.shape[:2]) != (1, 1) or 0 in raw.shape:
        raise ValueError(f"{file}: map has shape {_shape(raw)}; expected [1, 1, h, w] with h, w >= 1")
    prob = info["prob"] if torch.is_tensor(info["prob"]) else torch.as_tensor(info["prob"], dtype=torch.float64)
    if prob.numel() == len(CHEXPERT_14):
        if info.get("task") not in CHEXPERT_14:
            raise ValueError(f"{file}: 14 probabilities need the task they are read for, one of {list(CHEXPERT_14)}; "
                             f"got task {info.get('task')!r}")
        prob = prob.flatten()[CHEXPERT_14.index(info["task"])]
    elif prob.numel() != 1:
        raise ValueError(f"{file}: prob has shape {_shape(prob)}; expected one number or CheXpert's 14")
    width, height = _image_size(_listed(info["cxr_dims"]), str(file), "cxr_dims (width, height)")
    arrays = {"map": raw[0, 0], "prob": prob.reshape(())}
    return SavedPair(_map(arrays, "map", (), str(file)), _logit(arrays, "logit", "prob", (), str(file)),
                     image_size=(height, width))


def _read_box_lines(path: Path) -> dict[tuple[str, str], dict]:
    """(image_id, finding key) -> {boxes, scores, image_size, logit, where} from a JSON Lines file."""
    lines: dict[tuple[str, str], dict] = {}
    with open_text(path) as handle:
        for number, text in enumerate(handle, start=1):
            if not text.strip():
                continue
            where = f"{path}, line {number}"
            try:
                line = json.loads(text)
                pair = (str(line["image_id"]), str(line["finding"]))
                boxes = [[float(v) for v in box] for box in line["boxes"]]
                scores = None if line.get("scores") is None else [float(v) for v in line["scores"]]
                image_size = _image_size(line["image_size"], where)
                logit = _score(float(line["logit"]), "logit", where) if "logit" in line else \
                    _score(float(line["prob"]), "prob", where)
            except (KeyError, TypeError, ValueError, json.JSONDecodeError) as error:
                if isinstance(error, ValueError) and str(error).startswith(where):
                    raise
                raise ValueError(
                    f"{where}: {error!r}; each line needs image_id, finding, image_size [height, width], boxes "
                    "[[x1, y1, x2, y2], ...] and logit or prob (scores optional)"
                ) from None
            if any(len(box) != 4 or not all(map(math.isfinite, box)) or box[2] < box[0] or box[3] < box[1]
                   for box in boxes):
                raise ValueError(f"{where}: boxes must be [x1, y1, x2, y2], finite, with x1 <= x2 and y1 <= y2; "
                                 f"got {boxes}")
            if scores is not None and (len(scores) != len(boxes) or not all(map(math.isfinite, scores))):
                raise ValueError(f"{where}: scores must be one finite number per box; got {scores} for {len(boxes)} boxes")
            if pair in lines:
                raise ValueError(f"{where}: a second line for {pair}")
            lines[pair] = {"boxes": boxes, "scores": scores, "image_size": image_size, "logit": logit, "where": where}
    return lines
