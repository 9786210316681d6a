"""``XBenchModel``: the LightningModule every model under test subclasses.

The base owns the evaluation: ``setup`` reads the datamodule's classes and creates the metrics,
``test_step`` places and normalises the model's maps and updates the metrics, and the end of the
epoch checks that every sample was seen exactly once, logs the summary numbers and keeps the run's
`results` (the ``metrics.json`` payload) and `records`.
It writes nothing: the results folder, the overlays and the W&B run are the output callback's
([`xbench.reporting.writer.ResultsWriter`][xbench.reporting.writer.ResultsWriter], which
``xbench.test`` adds; a script adds it to its ``Trainer``). A subclass only says how to turn images
into scores and maps:

- ``build(classes)``: the text side and the checkpoint, once per run (called from ``setup``, with
  ``self.dataset_name`` already set for models whose prompts depend on the dataset).
- ``preprocess``: its authors' input transform and map rule as a
  [`Preprocess`][xbench.geometry.preprocess.Preprocess]; ``setup`` hands it to the datamodule, whose
  workers make ``model_input`` and its ``window`` from the native image. ``None`` (baselines, the
  Oracle): the model reads the frame image ``image`` and its maps cover the whole frame.
- ``forward(model_input [B,3,s,s]) -> (logits [B,C], maps [B,C,h,w])``: ``logits`` are log-odds
  (``sigmoid`` is the model's probability), ``maps`` raw saliency on the model's own grid covering
  the window of the frame its input shows.
- ``cam_target``: where a CAM explainer (``--model.explainer gradcam``, ...) reads it, as a
  [`CamTarget`][xbench.models.explainers.CamTarget] (layer, token layout, class score); the base's
  [`explain`][xbench.models.base.XBenchModel.explain] then gives that explainer's maps in place of
  ``forward``'s.

Phrase grounding (a dataset whose images carry free-text queries, such as MS-CXR): a model whose
text side encodes free text sets ``query_mode = "phrase"`` and implements ``encode_phrases``, which
returns its text side for the phrases as the attributes ``forward`` reads, one row per phrase; the
base then runs ``forward`` with a batch's phrases in place of the classes
([`phrase_outputs`][xbench.models.base.XBenchModel.phrase_outputs]: the phrases' scores and maps). A fixed-vocabulary model (MedKLIP,
MAVL; baselines) keeps ``query_mode = "finding"``: it grounds the map of the phrase's finding, and
the results say so.
"""

from __future__ import annotations

import warnings
from abc import ABC
from contextlib import contextmanager
from dataclasses import dataclass
from typing import ClassVar, Literal

import lightning as L
import torch
from torch import Tensor

from xbench.metrics import ClassificationMetrics, GroundingMetrics
from xbench.metrics.common import MetricValues, PackedSyncMetric
from xbench.metrics.gaze import GazeMetrics
from xbench.metrics.native import himl_native_saliency
from xbench.metrics.phrases import SentenceScores
from xbench.geometry.maps import near_constant, normalise, place_in_frame, seen_pixels, whole_frame
from xbench.geometry.preprocess import MapUpsample, Preprocess
from xbench.models.explainers import NATIVE, CamTarget, Explainer, cam_maps, check_explainer, explainer_record
from xbench.results.payload import build_results, gaze_section, log_keys, map_quality_sections


#: Phrases encoded per call at the start of a phrase-grounding run (MS-CXR has about 1,100).
PHRASES_PER_CALL = 64


@dataclass(frozen=True)
class LayerGroup:
    """One group of a model's layers for the cascading randomisation of the sanity check
    (`xbench.checks.sanity`); a model lists its groups from the output down.

    ``patterns``: ``fnmatch`` patterns of the model's parameter names (``named_parameters``) the group
    holds; a parameter belongs to the first group, in the model's order, that matches it. ``blocks``: the
    name of a ``ModuleList`` among the group's parameters whose blocks are randomised one step each, the
    last block first, before the group's remaining parameters. ``text``: the text side ``build`` encodes
    depends on the group, so it is encoded again after the group is randomised.
    """

    name: str
    patterns: tuple[str, ...]
    blocks: str | None = None
    text: bool = False


def resnet_stages(prefix: str, stages: dict[str, str] | None = None, name: str = "image tower") -> tuple[LayerGroup, ...]:
    """The layer groups of a ResNet under ``prefix``: each stage from the last (``stages``: sub-module
    name -> stage, default torchvision's ``layer4`` ... ``layer1``), then the rest (the stem, and a
    classification head the maps do not use)."""
    stages = stages or {f"layer{i}": f"layer{i}" for i in (4, 3, 2, 1)}
    return (*(LayerGroup(f"{name}: {label}", (f"{prefix}.{module}.*",)) for module, label in stages.items()),
            LayerGroup(f"{name}: stem", (f"{prefix}.*",)))


class RegionCounts(PackedSyncMetric):
    """Data-quality counters carried by the batch: shapes clipped at the image border and
    annotated regions (and a phrase dataset's query regions) that came out empty inside the frame
    (left out of grounding)."""

    full_state_update = False

    def __init__(self, num_classes: int, **kwargs) -> None:
        super().__init__(**kwargs)
        self.add_state("clipped_shapes", torch.zeros((), dtype=torch.int64), dist_reduce_fx="sum")
        self.add_state("lost_regions", torch.zeros(num_classes, dtype=torch.int64), dist_reduce_fx="sum")
        self.add_state("lost_queries", torch.zeros((), dtype=torch.int64), dist_reduce_fx="sum")

    def update(self, clipped_shapes: Tensor, lost_regions: Tensor, lost_queries: Tensor | None = None) -> None:
        self.clipped_shapes += clipped_shapes.sum()
        self.lost_regions += lost_regions.sum(0)
        if lost_queries is not None:
            self.lost_queries += lost_queries.sum()

    def compute(self) -> MetricValues:
        # MetricValues, not a dict: torchmetrics would squeeze a one-class dataset's [1] counts
        return MetricValues({"clipped_shapes": self.clipped_shapes, "lost_regions": self.lost_regions.clone(),
                             "lost_queries": self.lost_queries})


class XBenchModel(L.LightningModule, ABC):
    """Base of every model under test.

    Args:
        upsample: how maps reach the frame, overriding the model's own rule (its ``preprocess``) for a
            study: ``nearest``, ``bilinear`` or ``bilinear_align_corners``; the results record the rule used.
        explainer: which method makes the maps: ``native`` (the model's own) or a CAM method of the
            grad-cam library on the model's declared layer (``gradcam``, ``gradcam++``, ``hirescam``,
            ``xgradcam``, ``layercam``, ``eigencam``, ``scorecam``;
            [`xbench.models.explainers`][xbench.models.explainers]).
        phrase_protocol: how a phrase dataset's queries are scored: ``xbench`` (default: in the
            metric frame, as every pair) or ``hi-ml`` (BioViL's phrase grounding: the map and the
            query's boxes at the image's native size, the pixels outside the model's crop in
            neither of CNR's sides; `himl_native_saliency`). The
            results record it under ``phrase_grounding.protocol``.
    """

    #: The model's one name: its results folders, ``metrics.json``, the console, W&B, a reference's
    #: rows; default: the class name in lower case.
    name: ClassVar[str | None] = None
    #: How the report's tables and figures show it (the paper prints ``MedKLIP``); default: ``name``.
    display_name: ClassVar[str | None] = None
    #: Whether ``sigmoid(logit)`` is a probability. A model whose scores are only a ranking says
    #: False; its F1 and accuracy at p >= 0.5 are then flagged in the results as an arbitrary cut.
    calibrated_logits: ClassVar[bool] = True
    #: A test instrument (the Oracle reads the answer): reports show it as the ceiling, never ranked
    #: and never a point in R², fits or paired differences.
    instrument: ClassVar[bool] = False
    #: A radiologist scored like a model (`xbench.models.readers.HumanReader`): reports show it beside
    #: the models as the human scale, never ranked, and measure each model's gap to it.
    human: ClassVar[bool] = False
    #: The authors' input transform and map rule; ``None``: the model reads the frame image.
    preprocess: Preprocess | None = None
    #: How a free-text query is grounded: ``phrase`` (the text side encodes the phrase, see
    #: `encode_phrases`) or ``finding`` (the map of the phrase's finding).
    query_mode: ClassVar[Literal["phrase", "finding"]] = "finding"
    #: Where a CAM explainer reads the model (layer, token layout, class score); ``None``: the model
    #: has no network to explain and runs only with its native maps.
    cam_target: ClassVar[CamTarget | None] = None
    #: The model's layer groups from the output down, for the sanity check's cascading randomisation;
    #: every parameter of more than one element must fall in a group. Empty: a model without weights.
    layer_groups: ClassVar[tuple[LayerGroup, ...]] = ()

    def __init__(self, upsample: MapUpsample | None = None, explainer: Explainer = NATIVE,
                 phrase_protocol: Literal["xbench", "hi-ml"] = "xbench") -> None:
        super().__init__()
        # Not handed to loggers: Lightning would merge them flat with the datamodule's and fail on
        # a shared name (a model's and a dataset's `image_size`); the run's config is logged whole.
        self.save_hyperparameters(logger=False)
        if upsample not in (None, "nearest", "bilinear", "bilinear_align_corners"):
            raise ValueError(f"--model.upsample must be nearest, bilinear or bilinear_align_corners; got {upsample!r}")
        self.upsample_mode = upsample
        check_explainer(type(self), explainer)
        self.explainer = explainer
        if phrase_protocol not in ("xbench", "hi-ml"):
            raise ValueError(f"--model.phrase_protocol must be xbench or hi-ml; got {phrase_protocol!r}")
        self.phrase_protocol = phrase_protocol
        self.classes: list[str] = []
        #: The datamodule's ``name`` (``chestx_det10``, ...), set before ``build``.
        self.dataset_name: str | None = None
        #: The resolved run configuration (set by ``xbench.test``), recorded in the results.
        self.run_config: dict | None = None
        #: The last run's results: the ``metrics.json`` payload, and the metrics' per-pair records
        #: (``grounding``, ``classification``, a phrase run's ``queries`` by view) behind its tables.
        self.results: dict | None = None
        self.records: dict | None = None
        #: What run-level checks (the sanity, faithfulness and robustness callbacks, `xbench.checks`) computed
        #: in this epoch, by section name: (the ``metrics.json`` section, its per-pair records). They
        #: fill it in their ``on_test_epoch_end``, which Lightning calls before the model's own; the
        #: model's results then carry each section, and its records go beside the run's.
        self.checks: dict[str, tuple[dict, dict[str, Tensor]]] = {}

    @classmethod
    def model_name(cls) -> str:
        return cls.name or cls.__name__.lower()

    def display(self) -> str:
        """The model's display name, written into its results (``names.model``) for every reader."""
        return self.display_name or self.model_name()

    def run_name(self) -> str:
        """The name of a run's results, report row and W&B run: the model's name, joined by a CAM
        explainer's (``clip+gradcam++``); the model's name alone for its native maps."""
        return self.model_name() if self.explainer == NATIVE else f"{self.model_name()}+{self.explainer}"

    def explainer_results(self) -> dict:
        """``metrics.json``'s ``explainer`` section
        ([`explainer_record`][xbench.models.explainers.explainer_record])."""
        return explainer_record(self)

    @property
    def map_upsample(self) -> MapUpsample:
        """How this run places maps into the frame: ``--model.upsample``, else the authors' rule."""
        if self.upsample_mode is not None:
            return self.upsample_mode
        return self.preprocess.map_upsample if self.preprocess is not None else "bilinear"

    # -- what subclasses implement -------------------------------------------------------------

    def build(self, classes: list[str]) -> None:
        """Prepare the text side and load the checkpoint for ``classes`` (once per run)."""

    def forward(self, model_input: Tensor) -> tuple[Tensor, Tensor]:
        raise NotImplementedError(f"{type(self).__name__} must implement forward(model_input) -> (logits, maps)")

    def encode_phrases(self, phrases: list[str]) -> dict[str, Tensor]:
        """The text side for free-text ``phrases`` (``query_mode = "phrase"`` models): attribute name
        -> the value ``forward`` reads there, one row (dim 0) per phrase, in the model's own prompt
        style for phrases. Called once per run with every phrase of the split."""
        raise NotImplementedError(f"{type(self).__name__} has query_mode 'phrase' but no encode_phrases(phrases)")

    @torch.no_grad()
    def encode_all_phrases(self, phrases: list[str]) -> dict[str, Tensor]:
        """[`encode_phrases`][xbench.models.base.XBenchModel.encode_phrases] of every phrase of the
        split, `PHRASES_PER_CALL` at a time (a text tower holds every token's state of the phrases
        it encodes), the rows concatenated."""
        chunks = [self.encode_phrases(phrases[start : start + PHRASES_PER_CALL])
                  for start in range(0, len(phrases), PHRASES_PER_CALL)]
        return {name: torch.cat([chunk[name] for chunk in chunks]) for name in chunks[0]}

    @contextmanager
    def text_side(self, rows: dict[str, Tensor]):
        """``forward`` reads ``rows`` as its text side inside the block; the classes' after it."""
        saved = {name: getattr(self, name) for name in rows}
        try:
            for name, value in rows.items():
                setattr(self, name, value)
            yield
        finally:
            for name, value in saved.items():
                setattr(self, name, value)

    def phrase_outputs(self, model_input: Tensor, rows: dict[str, Tensor]) -> tuple[Tensor, Tensor]:
        """Scores [B, T] and maps [B, T, h, w] of the T phrases whose text side ``rows`` holds (rows
        of [`encode_phrases`][xbench.models.base.XBenchModel.encode_phrases]):
        [`explain`][xbench.models.base.XBenchModel.explain] with the phrases in place of the
        classes. A model whose prompts are decoded together (KAD's query set) grounds each phrase on
        its own instead."""
        with self.text_side(rows):
            return self.explain(model_input)

    def phrase_maps(self, model_input: Tensor, rows: dict[str, Tensor]) -> Tensor:
        """The maps of [`phrase_outputs`][xbench.models.base.XBenchModel.phrase_outputs]."""
        return self.phrase_outputs(model_input, rows)[1]

    def explain(self, model_input: Tensor) -> tuple[Tensor, Tensor]:
        """Logits and the maps of the run's explainer: ``forward``'s own, or a CAM method's on the
        declared layer, explaining each logit ([`cam_maps`][xbench.models.explainers.cam_maps]). The
        one place maps are made from an input: the run
        ([`infer`][xbench.models.base.XBenchModel.infer]) and the checks re-running the model on
        inputs of their making (``xbench.checks``) both call it."""
        return self(model_input) if self.explainer == NATIVE else cam_maps(self, model_input)

    def infer(self, batch: dict) -> tuple[Tensor, Tensor]:
        """Scores and maps for a batch: a model sees only its input (test instruments may see more)."""
        return self.explain(batch["image"] if self.preprocess is None else batch["model_input"])

    def extra_results(self) -> dict:
        """Sections this model adds to ``metrics.json`` at the end of a run, each under its own
        labelled key (e.g. saved outputs' counts, another protocol's scores); none by default."""
        return {}

    def extra_records(self) -> dict:
        """Per-pair records this model adds to the run's, by name (``chexlocalize``: cheXlocalize's
        protocol at native size, `xbench.metrics.native.chexlocalize_records`); none by default."""
        return {}

    # -- the run ------------------------------------------------------------------------------

    def setup(self, stage: str) -> None:
        datamodule = getattr(self.trainer, "datamodule", None)
        classes = list(getattr(datamodule, "classes", None) or [])
        if not classes:
            raise RuntimeError(
                f"{type(self).__name__} needs an XBench datamodule (with `classes`): "
                "call trainer.test(model, datamodule=...)"
            )
        # Every run builds anew, also on the same classes and dataset name: what build reads may
        # differ (another root or split, a precomputed model's image ids), and a model reused for
        # the next dataset (xbench.suite_worker) must run as a fresh one would. Weights load once:
        # each model's build skips what it has already loaded.
        self.classes, self.dataset_name = classes, getattr(datamodule, "name", None)
        self.grounding = GroundingMetrics(len(classes), validate_args=False, map_quality=True)
        self.classification = ClassificationMetrics(len(classes))
        self.region_counts = RegionCounts(len(classes))
        # a gaze dataset (its batches carry `gaze`): every map is also scored against the radiologists' gaze,
        # with the dataset's centre bias as the baseline of information gain and shuffled NCC
        baseline = datamodule.gaze_baseline()
        self.gaze = GazeMetrics(len(classes), baseline) if baseline is not None else None
        self.build(classes)
        # A phrase dataset's queries: scored by the model's grounding of each phrase (its query_mode)
        # and, for a phrase-mode model, also by the map of the phrase's finding name, on the same pairs.
        phrases = list(getattr(datamodule, "phrases", []))
        if self.phrase_protocol == "hi-ml" and not phrases:
            warnings.warn(f"--model.phrase_protocol hi-ml has no effect on {self.dataset_name}: it has no "
                          "phrase queries", stacklevel=1)
        if self.phrase_protocol == "hi-ml" and phrases and getattr(datamodule, "augment", None) is not None:
            raise ValueError("--model.phrase_protocol hi-ml scores the image as read, at its native size; it cannot "
                             "follow --data.augment. Drop one of them.")
        by_phrase = phrases and self.query_mode == "phrase"
        self.phrase_text = self.encode_all_phrases(phrases) if by_phrase else None
        self.query_grounding = GroundingMetrics(len(classes), validate_args=False) if phrases else None
        self.name_grounding = GroundingMetrics(len(classes), validate_args=False) if by_phrase else None
        # A dataset whose reports deny findings (negative sentences): every query's score is recorded
        denies = bool(phrases) and any(not query.asserted for sample in datamodule.samples
                                       for query in sample.queries)
        self.sentence_scores = SentenceScores() if denies else None
        datamodule.set_model_transform(self.preprocess)

    def run_metrics(self) -> list:
        return [metric for metric in (self.grounding, self.classification, self.region_counts, self.query_grounding,
                                      self.name_grounding, self.sentence_scores, self.gaze) if metric is not None]

    def on_test_epoch_start(self) -> None:
        for metric in self.run_metrics():
            metric.reset()
        self.checks = {}

    def test_step(self, batch: dict, batch_idx: int) -> dict[str, Tensor]:
        """Score a batch; returns its ``logits`` [B, C] and the ``saliency`` [B, C, S, S] in the frame
        (what an output callback's ``on_test_batch_end`` receives, e.g. the overlays')."""
        logits, maps = self.infer(batch)
        masks = batch["masks"]
        batch_size, num_classes = masks.shape[:2]
        if tuple(logits.shape) != (batch_size, num_classes) or maps.ndim != 4 or tuple(maps.shape[:2]) != (
            batch_size,
            num_classes,
        ):
            raise RuntimeError(
                f"{type(self).__name__} returned logits {tuple(logits.shape)} and maps {tuple(maps.shape)}; "
                f"expected [{batch_size}, {num_classes}] and [{batch_size}, {num_classes}, h, w]"
            )
        torch._assert_async(torch.isfinite(maps).all() & torch.isfinite(logits).all(),
                            f"{type(self).__name__} produced non-finite logits or maps")
        saliency, seen = self.frame_saliency(maps, batch)
        self.grounding.update(saliency, masks, batch["has_mask"], batch["index"], seen=seen)
        self.classification.update(logits.float(), batch["labels"], batch["index"])
        self.region_counts.update(batch["clipped_shapes"], batch["lost_regions"], batch.get("query_lost"))
        if self.query_grounding is not None:
            self.ground_queries(batch, logits, maps)
        if "gaze" in batch:
            if self.gaze is None:
                raise RuntimeError(f"{type(self.trainer.datamodule).__name__}'s batches carry gaze, but its "
                                   "gaze_baseline() gave no centre bias, which the gaze metrics need: have it return "
                                   "the mean gaze density of the training readings [S, S] (docs/gaze.md)")
            self.gaze.update(saliency, batch["gaze"], batch["fixations"], batch["has_gaze"],
                             batch["shuffled_fixations"], batch["index"])
        return {"logits": logits, "saliency": saliency}

    def frame_saliency(self, maps: Tensor, batch: dict) -> tuple[Tensor, Tensor | None]:
        """Maps [B, K, h, w] on the model's grid -> normalised saliency [B, K, S, S] in the frame, and
        the frame pixels the model saw [B, S, S] (``None``: all; CNR takes only these)."""
        batch_size, frame = maps.shape[0], tuple(batch["masks"].shape[-2:])
        if self.preprocess is None:
            windows, seen = whole_frame(batch_size, frame, maps.device), None
        else:
            windows = batch["window"]
            seen = seen_pixels(windows, frame)
        # a map that points nowhere becomes all zeros: the metrics count it as constant, a miss
        saliency = normalise(place_in_frame(maps, windows, frame, self.map_upsample))
        return saliency.masked_fill_(near_constant(maps)[..., None, None], 0.0), seen

    def ground_queries(self, batch: dict, class_logits: Tensor, class_maps: Tensor) -> None:
        """Score a phrase dataset's (image, query) pairs: the map of each query's finding name and,
        for a phrase-mode model, the map of its phrase; where the dataset denies findings, record
        each query's score (its phrase's logit, or its finding's for a finding-mode model)."""
        query_class, query_phrase = batch["query_class"], batch["query_phrase"]
        grid = class_maps.shape[-2:]
        by_name = class_maps.gather(1, query_class.clamp(min=0)[..., None, None].expand(-1, -1, *grid))
        scores = class_logits.gather(1, query_class.clamp(min=0))
        scored = [(self.query_grounding, by_name)]
        phrase_ids = torch.unique(query_phrase[query_phrase >= 0]).cpu()
        if self.phrase_text is not None and len(phrase_ids):
            rows = {name: value[phrase_ids].to(class_maps.device) for name, value in self.phrase_text.items()}
            model_input = batch["image"] if self.preprocess is None else batch["model_input"]
            logits, maps = self.phrase_outputs(model_input, rows)
            position = torch.searchsorted(phrase_ids.to(query_phrase.device), query_phrase.clamp(min=0))
            position = position.clamp(max=maps.shape[1] - 1)
            by_phrase = maps.gather(1, position[..., None, None].expand(-1, -1, *grid))
            scores = logits.gather(1, position)
            scored = [(self.query_grounding, by_phrase), (self.name_grounding, by_name)]
        if self.sentence_scores is not None:
            self.sentence_scores.update(batch["index"], query_class, batch["query_asserted"], scores)
        native = self.native_queries(batch) if self.phrase_protocol == "hi-ml" else None
        for metric, maps in scored:
            if native is not None:
                self.ground_queries_natively(metric, maps, batch, native)
                continue
            saliency, seen = self.frame_saliency(maps, batch)
            metric.update(saliency, batch["query_masks"], batch["query_has_mask"], batch["index"], query_class, seen)

    def native_queries(self, batch: dict) -> list[tuple[int, tuple[int, int], Tensor]]:
        """Per image of the batch with queries: its row, native (height, width) from the batch's
        ``native_size``, and its queries' boxes drawn at that size, bool [1, Q, H, W] (every query of a run's
        finding, in slot order)."""
        samples, found = self.trainer.datamodule.samples, []
        sizes = batch["native_size"].tolist()  # one device sync, not one per image
        for b, index in enumerate(batch["index"].tolist()):
            queries = [query for query in samples[index].queries if query.finding in self.classes]
            if queries:
                image_size = tuple(sizes[b])
                masks = torch.stack([torch.from_numpy(query.region.to_mask(*image_size)[0]) if query.region is not None
                                     else torch.zeros(image_size, dtype=torch.bool) for query in queries])
                found.append((b, image_size, masks[None].to(batch["index"].device)))
        return found

    def ground_queries_natively(self, metric: GroundingMetrics, maps: Tensor, batch: dict,
                                native: list[tuple[int, tuple[int, int], Tensor]]) -> None:
        """hi-ml's protocol: each image's query maps at its native size
        ([`native_queries`][xbench.models.base.XBenchModel.native_queries]), one image at a time
        (native sizes differ)."""
        frame = tuple(batch["masks"].shape[-2:])
        for b, image_size, masks in native:
            slots = masks.shape[1]
            window = batch["window"][b] if self.preprocess is not None else None
            saliency, seen = himl_native_saliency(maps[b : b + 1, :slots], self.preprocess, window, frame, image_size,
                                                  self.map_upsample)
            metric.update(saliency, masks, masks.flatten(2).any(-1), batch["index"][b : b + 1],
                          batch["query_class"][b : b + 1, :slots], seen)

    def on_test_epoch_end(self) -> None:
        grounding = self.grounding.compute()
        classification = self.classification.compute()
        counts = self.region_counts.compute()
        queries = {view: metric.compute() for view, metric in (("query", self.query_grounding),
                                                               ("finding_name", self.name_grounding))
                   if metric is not None}
        datamodule = self.trainer.datamodule
        evaluated = classification["records"]["index"]
        if evaluated.numel() != torch.unique(evaluated).numel():
            raise RuntimeError(
                "some samples were evaluated more than once: the test loader must not be re-sampled. "
                "Use the datamodule's loader with Trainer(use_distributed_sampler=False)."
            )
        total = len(datamodule.test_set)
        if evaluated.numel() < total:
            warnings.warn(
                f"only {evaluated.numel()} of {total} samples were evaluated (limit_test_batches?); "
                "the results say so under data.images_evaluated",
                stacklevel=1,
            )
        clipped, lost = int(counts["clipped_shapes"]), int(counts["lost_regions"].sum())
        notes = [f"{clipped} annotated shapes reached outside their image and were clipped"] if clipped else []
        if lost:
            notes.append(f"{lost} annotated regions were empty inside the frame and left out of grounding")
        if int(counts["lost_queries"]):
            notes.append(f"{int(counts['lost_queries'])} query regions were empty inside the frame and left out")
        if notes:
            warnings.warn(
                "; ".join(notes) + " (counted under data.clipped_shapes and data.lost_regions in metrics.json)",
                stacklevel=1,
            )
        self.results = build_results(
            model=self,
            datamodule=datamodule,
            grounding=grounding,
            classification=classification,
            region_counts=counts,
            config=self.run_config,
            queries=queries,
            sentences=self.sentence_scores.compute() if self.sentence_scores is not None else None,
        )
        self.results.update(self.extra_results())
        gaze = self.gaze.compute() if self.gaze is not None else None
        if gaze is not None:
            self.results["gaze"] = gaze_section(gaze, self.classes)
        # Quantus' families on every graded pair, then the checks the run asked for (xbench.checks)
        explained = {**map_quality_sections(grounding["records"], self.classes, datamodule.image_size**2),
                     **self.checks}
        self.results.update({name: section for name, (section, _) in explained.items()})
        self.records = {"grounding": grounding["records"], "classification": classification["records"],
                        "queries": {name: values["records"] for name, values in queries.items()},
                        **{name: records for name, (_, records) in explained.items()},
                        **({"gaze": gaze["records"]} if gaze is not None else {}),
                        **self.extra_records()}
        # Every process holds the same synced values, so no key needs a collective of its own (a
        # 21-class run logs over 600): rank_zero_only skips the reduction, sync_dist says it is meant.
        self.log_dict(log_keys(self.results), sync_dist=True, rank_zero_only=True)


# The base is not a model: a subclass implements ``forward`` (or ``infer``, for one that reads the
# batch). abc has no rule for "one of two", so the base alone is marked abstract: it cannot be
# instantiated, and the CLI does not list it. A subclass's own ``abstractmethod`` (the open_clip and
# query-decoder families' hooks) keeps that family's base abstract in the same way.
XBenchModel.__abstractmethods__ = frozenset({"forward"})
