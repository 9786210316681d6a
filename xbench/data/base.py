"""The DataModule every dataset subclasses, the sample record, and the exactly-once sampler.

A dataset module only reads its annotation files into [`Sample`][xbench.data.base.Sample] records
(``index``); the base decodes images in DataLoader workers, draws regions at native size, resizes
image and masks to the batch geometry and yields the batch dict of the architecture contract:

``image`` float32 [B,1,S,S] in [0,1]; ``labels`` float32 [B,C] (1, 0, -1 unknown); ``masks``
bool [B,C,S,S]; ``has_mask`` bool [B,C]; ``index`` int64 [B]; ``image_id`` list[str];
``native_size`` int64 [B,2] (the image's height and width as decoded, before any augmentation: the
one reading of the file, so no model opens it again); and two
data-quality counters the results report: ``clipped_shapes`` int64 [B] (shapes that reached
outside the image) and ``lost_regions`` bool [B,C] (an annotated region empty inside the frame,
also when an augmentation pushed it out). When the model handed the datamodule its transform
([`XBenchDataModule.set_model_transform`][xbench.data.base.XBenchDataModule.set_model_transform]),
also ``model_input`` float32 [B,3,s,s], made in the workers from the native image (after decoding,
the cache and any augmentation), and ``window`` float32 [B,4], the (top, left, height, width) that
input covers in the frame.

A phrase-grounding dataset (MS-CXR) gives samples free-text [`Query`][xbench.data.queries.Query]
records; its batches then also carry a query axis of ``Q`` slots (the most queries any image of the
split has): ``query_masks`` bool [B,Q,S,S], ``query_has_mask`` bool [B,Q] (a slot holds a query
whose region is not empty in the frame), ``query_class`` int64 [B,Q] (the query's finding, an index
into the classes; -1 for an unused slot), ``query_phrase`` int64 [B,Q] (an index into the
datamodule's ``phrases``; -1 unused), ``query_asserted`` bool [B,Q] (False for a denied finding, a
report's negative sentence, which has no region and is never graded, and for an unused slot) and
``query_lost`` bool [B,Q] (a query region empty inside the frame, left out). Class-level datasets
carry none of these keys.
"""

from __future__ import annotations

import inspect
import shutil
import warnings
from abc import ABC, abstractmethod
from collections.abc import Iterator, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING, ClassVar

import lightning as L
import numpy as np
import torch
import torch.distributed as dist
from torch.utils.data import DataLoader, Dataset, Sampler

from rich.console import Console

from xbench.cache import cache_root, check_cache_writable
from xbench.data import augment, cache, io, queries, regions, transforms
from xbench.data.augment import AugmentConfig, augment_sample, build_pipeline
from xbench.data.cache import (
    Binding,
    CacheDamagedError,
    CachedDataset,
    build_cache,
    check_folder,
    code_digest,
    fingerprint,
    folder_size,
    quantise,
)
from xbench.data.io import read_coded
from xbench.data.queries import query_fields
from xbench.data.readers import ReaderSet
from xbench.data.regions import Region
from xbench.data.transforms import resize_image, resize_mask
from xbench.findings import Finding, check_classes, default_classes_of, register, spellings_of
from xbench.geometry import image as coded_image
from xbench.geometry.image import CodedImage
from xbench.geometry.preprocess import Preprocess

if TYPE_CHECKING:
    from xbench.data.queries import Query


#: The smallest and largest side of the square metric frame (``image_size``): a one-pixel frame
#: cannot show where a map points (every map in it is constant); beyond 4096 a batch's masks and
#: maps alone take batch x classes x side² x 5 bytes (8.75 GiB at 4096 for 8 images of 14 classes).
MIN_FRAME, MAX_FRAME = 2, 4096


@dataclass
class Sample:
    """One image of a split: where it is, its labels and its regions, by canonical class key; a
    phrase-grounding dataset also lists the image's queries
    ([`xbench.data.queries.Query`][xbench.data.queries.Query])."""

    image_id: str
    path: Path
    labels: dict[str, int]
    regions: dict[str, Region] = field(default_factory=dict)
    queries: tuple[Query, ...] = ()


class ExactlyOnceSampler(Sampler[int]):
    """Rank ``r`` of ``w`` takes samples ``r, r + w, r + 2w, ...``: every sample once, no padding.

    Lightning's default DistributedSampler pads ranks to equal length by repeating samples, which
    would count those images twice; this sampler needs ``use_distributed_sampler=False``.
    """

    def __init__(self, num_samples: int, num_replicas: int | None = None, rank: int | None = None) -> None:
        if num_replicas is None or rank is None:
            initialised = dist.is_available() and dist.is_initialized()
            num_replicas = dist.get_world_size() if initialised else 1
            rank = dist.get_rank() if initialised else 0
        self.indices = range(rank, num_samples, num_replicas)

    def __iter__(self) -> Iterator[int]:
        return iter(self.indices)

    def __len__(self) -> int:
        return len(self.indices)


class XBenchDataset(Dataset):
    """Decodes, rasterises, optionally augments and resizes one sample; runs in DataLoader workers."""

    def __init__(
        self,
        samples: Sequence[Sample],
        classes: Sequence[str],
        image_size: int,
        mask_threshold: float,
        augment: AugmentConfig | None = None,
        augment_seed: int = 0,
        query_slots: int = 0,
        phrases: Sequence[str] = (),
    ):
        self.samples = samples
        self.classes = list(classes)
        self.image_size = image_size
        self.mask_threshold = mask_threshold
        self.pipeline = build_pipeline(augment) if augment is not None else None
        self.augment_seed = augment_seed
        self.query_slots = query_slots
        self.phrase_row = {text: row for row, text in enumerate(phrases)}

    def __len__(self) -> int:
        return len(self.samples)

    def __getitem__(self, index: int) -> dict:
        return self.item(index, with_native=False)[0]

    def item(self, index: int, with_native: bool) -> tuple[dict, CodedImage | np.ndarray | None]:
        """The sample dict and, if asked, the native image as decoded (its codes and levels), or
        as augmented (float32)."""
        sample = self.samples[index]
        native = read_coded(sample.path)
        image = native.to_float()
        height, width = image.shape
        size, num_classes = self.image_size, len(self.classes)
        # Class regions under their class index, query regions under num_classes + slot: one list
        # through the augmentation, so a query's mask moves with its class's.
        drawn_masks: dict[int, np.ndarray] = {}
        clipped = 0
        image_queries = [q for q in sample.queries if q.finding in self.classes]
        drawn = [(c, sample.regions.get(key)) for c, key in enumerate(self.classes)]
        drawn += [(num_classes + slot, query.region) for slot, query in enumerate(image_queries)]
        for target, region in drawn:
            if region is not None:
                drawn_masks[target], clipped_shapes = region.to_mask(height, width)
                clipped += clipped_shapes if target < num_classes else 0  # a query's boxes are its class's too
        if self.pipeline is not None:
            image, augmented = augment_sample(self.pipeline, self.augment_seed, index, image, list(drawn_masks.values()))
            drawn_masks = dict(zip(drawn_masks, augmented))
            native = image
        targets = num_classes + self.query_slots
        masks = torch.zeros(targets, size, size, dtype=torch.bool)
        has_mask = torch.zeros(targets, dtype=torch.bool)
        lost = torch.zeros(targets, dtype=torch.bool)
        for target, mask in drawn_masks.items():
            if mask.any():
                masks[target] = resize_mask(mask, size, self.mask_threshold)
                has_mask[target] = True
            else:
                lost[target] = True
        record = {
            "image": quantise(resize_image(image, size)),
            "labels": torch.tensor([float(sample.labels[key]) for key in self.classes]),
            "masks": masks[:num_classes],
            "has_mask": has_mask[:num_classes],
            "index": index,
            "image_id": sample.image_id,
            "native_size": torch.tensor([height, width]),
            "clipped_shapes": clipped,
            "lost_regions": lost[:num_classes],
        }
        if self.query_slots:
            record.update(query_fields(image_queries, self.classes, self.phrase_row, self.query_slots))
            record.update(query_masks=masks[num_classes:], query_has_mask=has_mask[num_classes:],
                          query_lost=lost[num_classes:])
        return record, native if with_native else None


#: The code that decides the cached pixels; its source is part of the cache's fingerprint.
PIXEL_CODE = (io, coded_image, regions, transforms, augment, cache, queries, XBenchDataset)


class ModelInputDataset(Dataset):
    """The test set with the model's own input and its window added to every sample, made in the
    DataLoader workers from the native image the decoded (or cached) sample comes with."""

    def __init__(self, decoded: XBenchDataset | CachedDataset, transform: Preprocess, frame: int) -> None:
        self.decoded = decoded
        self.transform = transform
        self.frame = frame

    def __len__(self) -> int:
        return len(self.decoded)

    def __getitem__(self, index: int) -> dict:
        record, native = self.decoded.item(index, with_native=True)
        record["model_input"], record["window"] = self.transform(native, self.frame)
        return record


class XBenchDataModule(L.LightningDataModule, ABC):
    """Base of every dataset: the class list, the exactly-once test loader, the batch geometry.

    Subclasses set ``name`` and implement [`index`][xbench.data.base.XBenchDataModule.index], which
    reads the annotation files, checks that every image file exists (without decoding it) and
    returns the split's samples in a stable order. Anything the loader skipped or merged goes into
    ``self.notes`` for the results.

    Vocabulary: a paper dataset's is in ``xbench.findings`` under its ``name`` (``spellings`` names
    another entry there if it shares one). A user's dataset states its own on the class, and the
    class registers it when defined: ``spellings = {raw label: finding key}``, ``findings`` (new
    ``Finding``s) and ``display_name`` (its name in tables); its default classes are every key its
    spellings reach (``xbench.findings.register`` takes another default).

    Args:
        root: the dataset folder, exactly as downloaded.
        classes: canonical finding keys; default: the paper's classes for this dataset.
        image_size: side of the square batch geometry (the paper: 224).
        mask_threshold: gamma, the area fraction at which a resized mask pixel is set.
        batch_size: images per batch (the paper: 8).
        num_workers: DataLoader worker processes that decode images.
        augment: an albumentations pipeline applied to image and masks together at native size, for
            robustness studies (see ``xbench.data.augment``); default none, the paper's protocol.
        augment_seed: with the sample index, seeds the pipeline for each sample.
        cache: decode each image once into the decoded-image cache under ``$XBENCH_CACHE``
            (``xbench.data.cache``) and read it from there in later runs; the numbers are the same
            bit for bit with and without it.
    """

    name: ClassVar[str]
    #: Whether each sample is one radiologist's read of an image (`xbench.reads`: several samples per
    #: radiograph, resampled together); a split's option may set it on the instance.
    reads: bool = False
    spellings: ClassVar[str | dict[str, str] | None] = None
    findings: ClassVar[tuple[Finding, ...]] = ()
    display_name: ClassVar[str | None] = None

    def __init__(
        self,
        root: str,
        classes: list[str] | None = None,
        image_size: int = 224,
        mask_threshold: float = 0.5,
        batch_size: int = 8,
        num_workers: int = 2,
        augment: AugmentConfig | None = None,
        augment_seed: int = 0,
        cache: bool = True,
    ) -> None:
        super().__init__()
        self.save_hyperparameters()
        for option, value, valid, rule in (
            ("mask_threshold", mask_threshold, 0 < mask_threshold <= 1, "in (0, 1]"),
            ("image_size", image_size, MIN_FRAME <= image_size <= MAX_FRAME,
             f"{MIN_FRAME} to {MAX_FRAME} pixels, the side of the metric frame (the paper's is 224)"),
            ("batch_size", batch_size, batch_size >= 1, "positive"),
            ("num_workers", num_workers, num_workers >= 0, "0 (load in the main process) or more"),
        ):
            if not valid:
                raise ValueError(f"--data.{option} must be {rule}; got {value}")
        self.root = Path(root).expanduser()
        try:
            self.classes = check_classes(
                classes if classes is not None else self.default_classes(), allowed=self.supported_classes()
            )
        except ValueError as error:
            raise ValueError(f"--data.classes: {error}") from None
        self.image_size = image_size
        self.mask_threshold = mask_threshold
        self.batch_size = batch_size
        self.num_workers = num_workers
        self.augment = augment
        self.augment_seed = augment_seed
        self.cache = cache
        self.model_transform: Preprocess | None = None
        self._cache_binding: Binding | None = None
        if augment is not None:
            build_pipeline(augment)  # fail at configuration time, naming the bad entry
        self.notes: dict[str, object] = {}
        self._samples: list[Sample] | None = None

    def __init_subclass__(cls, **kwargs) -> None:
        super().__init_subclass__(**kwargs)
        if isinstance(cls.__dict__.get("spellings"), dict):
            register(cls.name, cls.spellings, findings=cls.findings, display=cls.display_name)

    @classmethod
    def vocabulary_name(cls) -> str:
        """The entry of ``xbench.findings`` this dataset's labels are spelled in."""
        return cls.spellings if isinstance(cls.spellings, str) else cls.name

    @classmethod
    def spelling_table(cls) -> dict[str, str]:
        return spellings_of(cls.vocabulary_name())

    @classmethod
    def default_classes(cls) -> tuple[str, ...]:
        return default_classes_of(cls.vocabulary_name())

    @classmethod
    def supported_classes(cls) -> tuple[str, ...]:
        return tuple(dict.fromkeys(cls.spelling_table().values()))

    @abstractmethod
    def index(self) -> list[Sample]:
        """Read the annotation files into samples (stable order); check image files exist."""

    def require(self, path: Path, what: str) -> Path:
        """``path`` if it exists, else an error that says what was expected where."""
        if not path.exists():
            raise FileNotFoundError(
                f"{type(self).__name__}: {what} not found at {path}. Point `data.root` at the dataset "
                f"folder as downloaded (currently {self.root})."
            )
        return path

    @property
    def samples(self) -> list[Sample]:
        if self._samples is None:
            self.require(self.root, "the dataset folder")
            samples = self.index()
            if not samples:
                raise ValueError(f"{type(self).__name__}: no samples found under {self.root}")
            self.refuse_repeated_images(samples)
            self._samples = samples
        return self._samples

    def refuse_repeated_images(self, samples: list[Sample]) -> None:
        """Every image once: an image listed twice would be evaluated, and counted, twice. Formats
        that list an image on several rows (RSNA's boxes, VinDr's readers) merge them in ``index``."""
        rows: dict[str, list[int]] = {}
        for row, sample in enumerate(samples):
            rows.setdefault(sample.image_id, []).append(row)
        repeated = {image_id: found for image_id, found in rows.items() if len(found) > 1}
        if repeated:
            shown = "; ".join(f"{image_id} ({samples[found[0]].path.name}) at entries {', '.join(map(str, found))}"
                              for image_id, found in list(repeated.items())[:5])
            raise ValueError(
                f"{type(self).__name__}: {len(repeated)} image(s) are listed more than once in the annotation "
                f"files under {self.root} (entries counted from 0 in the split's order): {shown}. Keep one "
                "entry per image in the annotation file."
            )

    @property
    def phrases(self) -> list[str]:
        """The split's distinct query phrases (of the chosen classes' findings), in first-seen order;
        a batch's ``query_phrase`` indexes this list. Empty for a class-level dataset."""
        return list(dict.fromkeys(q.text for s in self.samples for q in s.queries if q.finding in self.classes))

    @property
    def query_slots(self) -> int:
        """``Q``, the query axis of a batch: the most queries (of the chosen classes) on one image."""
        return max((sum(q.finding in self.classes for q in s.queries) for s in self.samples), default=0)

    def decoding_dataset(self) -> XBenchDataset:
        return XBenchDataset(
            self.samples, self.classes, self.image_size, self.mask_threshold, self.augment, self.augment_seed,
            self.query_slots, self.phrases,
        )

    def cache_binding(self) -> Binding:
        """What this split's cache entry holds: the fingerprint of its samples and settings (the
        entry's name), the dataset, the split (the dataset's own options: its hyperparameters other
        than the base's and than the ``_class_path`` and ``_instantiator`` LightningCLI records) and
        the image ids in order."""
        if self._cache_binding is None:
            base_options = inspect.signature(XBenchDataModule.__init__).parameters
            own = {key: value for key, value in self.hparams.items()
                   if key not in base_options and not key.startswith("_")}
            split = ", ".join(f"{key}={value}" for key, value in sorted(own.items()))
            settings = {
                "dataset": f"{type(self).__module__}.{type(self).__qualname__}",
                "split": split,
                "classes": self.classes,
                "image_size": self.image_size,
                "mask_threshold": self.mask_threshold,
                "augment": self.augment,
                "augment_seed": self.augment_seed,
                "code": code_digest(*PIXEL_CODE),
            }
            self._cache_binding = Binding(fingerprint=fingerprint(self.samples, settings), dataset=self.name,
                                          split=split, image_ids=self.image_ids())
        return self._cache_binding

    def cache_folder(self) -> Path:
        """This split's cache entry, named by its dataset and fingerprint."""
        binding = self.cache_binding()
        return cache_root() / "decoded" / f"{binding.dataset}-{binding.fingerprint}"

    def prepare_data(self) -> None:
        """Write the decoded-image cache unless it exists (once per node, before ``setup``); an
        entry that fails the open check (damaged, of another format, or bound to other samples) is
        rebuilt, with a warning that says why."""
        if not self.cache:
            return
        folder, binding = self.cache_folder(), self.cache_binding()
        action = "written"
        if folder.exists() or folder.is_symlink():
            try:
                check_folder(folder, binding)
                action = "reading"
            except CacheDamagedError as error:
                warnings.warn(f"the decoded-image cache {folder} is damaged: {error.reason}; rebuilding it",
                              stacklevel=2)
                if folder.is_dir() and not folder.is_symlink():
                    shutil.rmtree(folder)
                else:  # a file, or a link, in the entry's place
                    folder.unlink()
                action = "rebuilt"
        if action != "reading":
            check_cache_writable()
            build_cache(folder, binding, self.decoding_dataset(), self.image_size, self.batch_size, self.num_workers)
        Console(stderr=True, soft_wrap=True).print(
            f"Decoded-image cache {action}: {folder} ({folder_size(folder) / 2**20:.1f} MiB, {len(self.samples)} images)"
        )

    def setup(self, stage: str | None = None) -> None:
        if self.cache and self.cache_folder().exists():
            self.test_set = CachedDataset(
                self.cache_folder(), self.cache_binding(), self.samples, self.classes, self.image_size,
                self.query_slots, self.phrases,
            )
        else:
            self.test_set = self.decoding_dataset()

    def set_model_transform(self, transform: Preprocess | None) -> None:
        """The model's own transform (its ``setup`` hands it over, after this datamodule's):
        batches then carry ``model_input`` and ``window``; ``None`` (baselines, the Oracle): no
        model input."""
        self.model_transform = transform

    def test_dataloader(self) -> DataLoader:
        dataset = self.test_set
        if self.model_transform is not None:
            dataset = ModelInputDataset(dataset, self.model_transform, self.image_size)
        return DataLoader(
            dataset,
            batch_size=self.batch_size,
            sampler=ExactlyOnceSampler(len(dataset)),
            num_workers=self.num_workers,
            pin_memory=torch.cuda.is_available(),
        )

    def image_ids(self) -> list[str]:
        return [sample.image_id for sample in self.samples]

    def reader_set(self) -> ReaderSet | None:
        """The radiologist under test on every sample, for a `HumanReader` run
        ([`xbench.data.readers`][xbench.data.readers]); ``None``: this dataset, as configured, has no
        second reader to score (the default)."""
        return None

    def gaze_baseline(self) -> torch.Tensor | None:
        """A gaze dataset's centre bias, float32 [S, S] in the metric frame: the mean gaze density of
        its training readings (Lanfredi et al.), the baseline of information gain and shuffled NCC and
        the map of ``gaze_centre_bias`` ([Where did the radiologist look?](../gaze.md)); its batches
        then carry the gaze keys. ``None``: no gaze (the default)."""
        return None
