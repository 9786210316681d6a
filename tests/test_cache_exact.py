"""The decoded-image cache never changes a number.

For every model input transform XBench ships (collected from the model classes), the batch the
datamodule yields with the cache equals the batch without it bit for bit -- ``model_input``,
``window``, ``image``, ``masks`` -- with DataLoader workers 0 and 2: on real radiographs whose
size is the point (the NIH PNG, both CheXpert JPEGs at native size, a 1600x600 and a 600x1600
crop) and on small files of every format whose decoding is the point (8/16-bit PNG, RGB-stored
grey, JPEG, 8/12/16-bit and signed DICOM, MONOCHROME1, VOI LUT, window, JPEG 2000), augmentation
on and off.
"""

from __future__ import annotations

import dataclasses
import importlib
import inspect
import json
import os
import pkgutil
import tempfile
from pathlib import Path
from types import SimpleNamespace

import numpy as np
import pytest
import torch
from PIL import Image
from pydicom.dataset import Dataset
from pydicom.sequence import Sequence

import xbench.models
from conftest import real_file, write_dicom
from xbench.data.chestx_det10 import ChestXDet10
from xbench.data.io import read_coded
from xbench.geometry.image import CodedImage
from xbench.models.base import XBenchModel
from xbench.geometry.preprocess import Preprocess

#: The input side the open_clip models read from their loaded weights: 224 for every checkpoint
#: XBench ships configs for (CLIP ViT-B/16 and ViT-B/32, BiomedCLIP).
OPEN_CLIP_SIDE = 224
#: Model classes with no input transform of their own: they take the frame image (baselines,
#: saved maps) or are a base that a model subclasses.
NO_TRANSFORM = {"RandomSaliency", "CentrePrior", "Oracle", "PrecomputedSaliency", "QueryDecoderModel", "HumanReader",
                "GazeCentreBias"}
BATCH_KEYS = ("model_input", "window", "image", "masks", "has_mask", "labels", "native_size", "clipped_shapes",
              "lost_regions")


def _subclasses(cls: type) -> list[type]:
    """XBench's own subclasses of ``cls`` (not a test's, which another test module may have defined)."""
    found = [sub for direct in cls.__subclasses__() for sub in (direct, *_subclasses(direct))]
    return [sub for sub in found if sub.__module__.startswith("xbench.")]


def _published_processors() -> list[Preprocess]:
    """A transformers folder's transform is its processor config's: those of the published
    checkpoints XBench ships configs for."""
    from xbench.models.hf_dual_encoder import processor_preprocess
    from xbench.models.random_weights import HF_DUAL_ENCODERS

    transforms = []
    with tempfile.TemporaryDirectory() as folder:
        for entry in HF_DUAL_ENCODERS.values():
            (Path(folder) / "preprocessor_config.json").write_text(json.dumps(entry["preprocessor"]))
            transforms.append(processor_preprocess(folder))
    return transforms


def _radzero_processor() -> list[Preprocess]:
    """RadZero's transform is its folder's processor config's: the published one's."""
    from xbench.models.radzero import processor_preprocess
    from xbench.models.random_weights import RADZERO_PREPROCESSOR

    with tempfile.TemporaryDirectory() as folder:
        (Path(folder) / "preprocessor_config.json").write_text(json.dumps(RADZERO_PREPROCESSOR))
        return [processor_preprocess(Path(folder))]


def _transforms_of(cls: type) -> list[Preprocess]:
    """The transforms a model class can run: its class-level ``preprocess``; an open_clip model's,
    which its loaded weights size; a transformers folder's or RadZero's, its processor config's; or
    the one its ``__init__`` builds, for every ``variant`` it lists and both histogram settings (built
    on the meta device: no weights)."""
    from xbench.models.hf_dual_encoder import HFDualEncoder
    from xbench.models.radzero import RadZero

    if issubclass(cls, HFDualEncoder):
        return _published_processors()
    if issubclass(cls, RadZero):
        return _radzero_processor()
    static = inspect.getattr_static(cls, "preprocess", None)
    if isinstance(static, Preprocess):
        return [static]
    if isinstance(static, property):
        return [static.fget(SimpleNamespace(input_size=OPEN_CLIP_SIDE))]
    parameters = inspect.signature(cls.__init__).parameters
    if any(p.default is p.empty and p.kind is p.POSITIONAL_OR_KEYWORD for p in list(parameters.values())[1:]):
        return []
    options = [{"variant": variant} for variant in cls.VARIANTS] if "variant" in parameters else [{}]
    if "equalize_histogram" in parameters:
        options = [{**option, "equalize_histogram": flag} for option in options for flag in (False, True)]
    with torch.device("meta"):
        built = [cls(**option).preprocess for option in options]
    return [transform for transform in built if transform is not None]


def shipped_transforms() -> tuple[dict[str, Preprocess], set[str]]:
    """Every distinct input transform of the model classes in ``xbench.models``, named by the first
    class (and option) that runs it (the map rule is not part of the input and is left out); and
    the classes without one."""
    for module in pkgutil.iter_modules(xbench.models.__path__):
        importlib.import_module(f"xbench.models.{module.name}")
    found: dict[Preprocess, str] = {}
    without = set()
    for cls in _subclasses(XBenchModel):
        transforms = _transforms_of(cls)
        if not transforms:
            without.add(cls.__name__)
        for transform in transforms:
            key = dataclasses.replace(transform, map_upsample="bilinear")
            found.setdefault(key, f"{cls.__name__}-{transform.size}{'-equalize' if transform.equalize else ''}")
    return {name: transform for transform, name in found.items()}, without


TRANSFORMS, WITHOUT_TRANSFORM = shipped_transforms()


def one_per_rule(transforms: dict[str, Preprocess]) -> dict[str, Preprocess]:
    """The smallest transform of each rule: where the format is the point, transforms that differ
    only in their sizes or statistics take the same path through the image."""
    rules = {}
    for name, transform in sorted(transforms.items(), key=lambda item: item[1].size):
        rule = dataclasses.replace(transform, size=1, resize_to=None, mean=(0, 0, 0), std=(1, 1, 1),
                                   map_upsample="bilinear")
        rules.setdefault(rule, (name, transform))
    return dict(rules.values())


RULES = one_per_rule(TRANSFORMS)


def test_every_shipped_model_is_collected():
    assert WITHOUT_TRANSFORM == NO_TRANSFORM, "a model class whose transform this test cannot collect"
    names = set(TRANSFORMS)
    for model in ("OpenClipDualEncoder", "CheXzero", "BioViL", "BioViLT", "CARZero", "KAD", "GLoRIA", "MedKLIP",
                  "RadZero"):
        assert any(name.startswith(f"{model}-") for name in names), model
    assert {"KAD-224", "KAD-512", "KAD-1024", "MedKLIP-224-equalize"} <= names


def write_split(root: Path, files: dict[str, Path]) -> Path:
    """A ChestX-Det10 split over ``files`` (name in the split -> file, linked), one box each."""
    (root / "test_data").mkdir(parents=True)
    entries = []
    for name, path in files.items():
        os.symlink(path, root / "test_data" / name)
        height, width = read_coded(path).shape
        entries.append({"file_name": name, "syms": ["Mass"],
                        "boxes": [[width // 5, height // 4, width // 2 + 1, height * 2 // 3 + 1]]})
    (root / "test.json").write_text(json.dumps(entries))
    return root


def batches(root: Path, cache: bool, workers: int, transforms: dict[str, Preprocess], **data) -> dict[str, dict]:
    """The one batch of the split per transform, through the datamodule."""
    dm = ChestXDet10(root=str(root), classes=["mass", "nodule"], batch_size=64, num_workers=workers, cache=cache, **data)
    dm.prepare_data()
    dm.setup()
    out = {}
    for name, transform in transforms.items():
        dm.set_model_transform(transform)
        (batch,) = list(dm.test_dataloader())
        out[name] = batch
    return out


def assert_identical(cached: dict[str, dict], decoded: dict[str, dict], files: list[str]) -> None:
    for name, batch in decoded.items():
        assert batch["image_id"] == cached[name]["image_id"] == files
        for key in BATCH_KEYS:
            if not torch.equal(cached[name][key], batch[key]):
                rows = [files[i] for i in range(len(files)) if not torch.equal(cached[name][key][i], batch[key][i])]
                pytest.fail(f"{name}: {key} differs with the cache on {rows}")


@pytest.fixture(scope="module")
def radiographs(tmp_path_factory, real_data) -> tuple[Path, list[str]]:
    """The real radiographs whose size is the point, a 12-bit DICOM and a 16-bit PNG."""
    folder = tmp_path_factory.mktemp("radiographs")
    chexpert = real_file(real_data, "chexlocalize/valid/patient64541/study1/view1_frontal.jpg")
    crop = np.asarray(Image.open(chexpert))
    Image.fromarray(crop[200:800, 300:1900]).save(folder / "wide.png")  # 1600 x 600
    Image.fromarray(crop[300:1900, 900:1500]).save(folder / "tall.png")  # 600 x 1600
    rng = np.random.default_rng(0)
    write_dicom(folder / "twelve.dcm", rng.integers(0, 4096, (330, 270), dtype=np.uint16), BitsStored=12)
    Image.fromarray(rng.integers(0, 65536, (250, 310), dtype=np.uint16)).save(folder / "sixteen.png")
    files = {
        "nih.png": real_file(real_data, "nih/00000001_000.png"),
        "chexpert_2828x2320.jpg": chexpert,
        "chexpert_2021x2022.jpg": real_file(real_data, "chexlocalize/valid/patient64542/study1/view1_frontal.jpg"),
        "wide.png": folder / "wide.png",
        "tall.png": folder / "tall.png",
        "twelve.dcm": folder / "twelve.dcm",
        "sixteen.png": folder / "sixteen.png",
    }
    return write_split(folder / "split", files), list(files)


@pytest.fixture(scope="module")
def decoded_radiographs(radiographs, tmp_path_factory) -> dict[str, dict]:
    """The reference: every transform's batch without the cache, in the main process."""
    return batches(radiographs[0], False, 0, TRANSFORMS)


@pytest.mark.parametrize("workers", [0, 2])
def test_real_radiographs_every_model_input_identical_with_and_without_cache(radiographs, decoded_radiographs,
                                                                             tmp_path, monkeypatch, workers):
    monkeypatch.setenv("XBENCH_CACHE", str(tmp_path / "cache"))
    root, files = radiographs
    assert_identical(batches(root, True, workers, TRANSFORMS), decoded_radiographs, files)


def format_files(folder: Path) -> dict[str, Path]:
    """Small files of every format the decoder reads (non-square; odd sizes)."""
    rng = np.random.default_rng(1)
    grey8 = rng.integers(0, 256, (45, 37), dtype=np.uint8)
    grey12 = rng.integers(0, 4096, (45, 37), dtype=np.uint16)
    grey16 = rng.integers(0, 65536, (45, 37), dtype=np.uint16)
    written = {}

    def raster(name: str, pixels: np.ndarray, **save) -> None:
        Image.fromarray(pixels).save(folder / name, **save)
        written[name] = folder / name

    def dicom(name: str, pixels: np.ndarray, **elements) -> None:
        write_dicom(folder / name, pixels, **elements)
        written[name] = folder / name

    raster("grey8.png", grey8)
    raster("grey16.png", grey16)
    raster("rgb_grey.png", np.repeat(grey8[..., None], 3, axis=2))
    raster("rgb.png", rng.integers(0, 256, (45, 37, 3), dtype=np.uint8))
    raster("grey.jpg", grey8, quality=90)
    dicom("eight.dcm", grey8)
    dicom("eight_jpeg.dcm", grey8, compression="jpeg")
    dicom("twelve.dcm", grey12, BitsStored=12)
    dicom("sixteen.dcm", grey16)
    dicom("monochrome1.dcm", grey12, BitsStored=12, PhotometricInterpretation="MONOCHROME1")
    dicom("window.dcm", grey12, BitsStored=12, RescaleSlope=0.37, RescaleIntercept=-11.3, WindowCenter=700.3,
          WindowWidth=801.7)
    dicom("signed.dcm", rng.integers(-2000, 2000, (45, 37)).astype(np.int16), PixelRepresentation=1, BitsStored=12,
          WindowCenter=100.0, WindowWidth=1000.0)
    lut = Dataset()
    lut.LUTDescriptor = [1024, 1000, 10]
    lut.add_new("LUTData", "US", (np.arange(1024) // 2 + 100).astype(np.uint16).tolist())
    dicom("voi_lut.dcm", grey12, BitsStored=12, VOILUTSequence=Sequence([lut]))
    dicom("j2k.dcm", grey12, compression="j2k", BitsStored=12)
    return written


@pytest.fixture(scope="module")
def formats(tmp_path_factory) -> tuple[Path, list[str], dict[str, Path]]:
    folder = tmp_path_factory.mktemp("formats")
    files = format_files(folder)
    return write_split(folder / "split", files), list(files), files


@pytest.mark.parametrize("augment", [None, [{"class_path": "albumentations.Rotate", "init_args": {"limit": 10, "p": 1.0}}]],
                         ids=["plain", "augmented"])
def test_every_format_every_model_input_identical_with_and_without_cache(formats, tmp_path, monkeypatch, augment):
    monkeypatch.setenv("XBENCH_CACHE", str(tmp_path / "cache"))
    root, names, _ = formats
    data = {"image_size": 32, "augment": augment}
    assert_identical(batches(root, True, 0, RULES, **data), batches(root, False, 0, RULES, **data), names)


def test_codes_and_levels_give_the_float_image_transform(formats):
    """A transform of the coded image equals the transform of its float image: the 8-bit step is
    pointwise, so it runs on the levels (what the datamodule passes, with or without the cache, and
    what a caller of ``read_image`` passes agree)."""
    _, _, files = formats
    # one file per kind of codes and levels: 8-bit (OpenCV's look-up), 16-bit, the channel sum,
    # levels that fall (MONOCHROME1), levels of a window over signed values
    for name in ("grey8.png", "grey16.png", "rgb_grey.png", "monochrome1.dcm", "signed.dcm"):
        coded = read_coded(files[name])
        assert isinstance(coded, CodedImage) and coded.codes.dtype in (np.uint8, np.uint16)
        for rule, transform in RULES.items():
            from_codes, from_float = transform(coded, 32), transform(coded.to_float(), 32)
            assert torch.equal(from_codes[0], from_float[0]) and torch.equal(from_codes[1], from_float[1]), (name, rule)
