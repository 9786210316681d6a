"""Reading radiographs: every loader goes through `read_coded` (or `read_image`).

A decoded radiograph is a `CodedImage`: integer codes at the file's native resolution (its
stored pixel values; for colour-stored grey the channel sum) and the grey level in [0, 1] of every
possible code, made by running the pointwise decoding arithmetic (scaling; a DICOM's modality LUT,
VOI LUT or window, clipping, MONOCHROME1 inversion) on the codes themselves. The float image is
always ``levels[codes]`` (``CodedImage.to_float``), whether it comes from the file or from the
decoded-image cache, which stores codes and levels: the two agree bit for bit by construction.

PNG and JPEG go through Pillow; DICOM through pydicom, with JPEG Baseline decoded by Pillow and
JPEG 2000 by pylibjpeg-openjpeg (both permissively licensed; the GPL pylibjpeg-libjpeg is not used).
"""

from __future__ import annotations

import os
import warnings
from pathlib import Path

import numpy as np
import pydicom
from PIL import Image, UnidentifiedImageError
from pydicom.errors import InvalidDicomError
from pydicom.pixels import apply_modality_lut, apply_voi, apply_windowing
from pydicom.pixels.decoders.base import get_decoder
from pydicom.uid import JPEG2000, JPEG2000Lossless, JPEGBaseline8Bit

from xbench.files import regular_file
from xbench.geometry.image import CodedImage

DICOM_SUFFIXES = (".dcm", ".dicom")

#: The permissively licensed package that decodes each compressed pixel format chest X-ray
#: datasets ship (pydicom finds it by itself once installed).
CODECS = {
    JPEGBaseline8Bit: "Pillow",
    JPEG2000Lossless: "pylibjpeg-openjpeg (or Pillow built with OpenJPEG)",
    JPEG2000: "pylibjpeg-openjpeg (or Pillow built with OpenJPEG)",
}


class ImageReadError(OSError):
    """An image file exists but cannot be decoded."""


def files_by_stem(folder: Path, suffixes: tuple[str, ...] = DICOM_SUFFIXES) -> dict[str, Path]:
    """Every file below ``folder`` whose suffix is in ``suffixes``, keyed by its name's stem.

    Release trees nest images by study and series and name each by its id, so the stem finds an
    image wherever the tree puts it. One walk of the listing; no file is opened. A stem found
    twice is an error, since either copy could be the one meant.
    """
    found: dict[str, Path] = {}
    for directory, _, names in os.walk(folder, followlinks=True):
        for name in names:
            stem, suffix = os.path.splitext(name)
            if suffix.lower() not in suffixes:
                continue
            path = Path(directory, name)
            if stem in found:
                raise ValueError(f"two files named {stem}{suffix} below {folder}: {found[stem]} and {path}; keep one")
            found[stem] = path
    return found


def read_image(path: str | Path) -> np.ndarray:
    """Decode ``path`` into a float32 grey image [H, W] in [0, 1] (``read_coded(path).to_float()``)."""
    return read_coded(path).to_float()


def read_coded(path: str | Path) -> CodedImage:
    """Decode ``path`` (PNG/JPEG, 8 or 16 bit, or DICOM) into its codes and their grey levels; a
    named pipe, a device or a folder in its place is named before Pillow or pydicom opens it."""
    try:
        path = regular_file(path)
    except FileNotFoundError:
        raise FileNotFoundError(f"image not found: {path}") from None
    if path.suffix.lower() in DICOM_SUFFIXES:
        return read_dicom(path)
    return read_raster(path)


def read_raster(path: Path) -> CodedImage:
    """PNG/JPEG through Pillow: the pixel values as codes; 8-bit levels are code / 255, 16-bit
    code / 65535; colour-stored grey is coded by its channel sum, its level the channel mean / 255."""
    try:
        with Image.open(path) as image:
            image.load()
            mode = image.mode
            if mode in ("RGBA", "LA", "P", "PA", "CMYK", "YCbCr", "1"):
                image = image.convert("RGB" if mode in ("RGBA", "P", "PA", "CMYK", "YCbCr") else "L")
                mode = image.mode
            pixels = np.asarray(image)
    except UnidentifiedImageError as error:
        raise ImageReadError(f"cannot decode image {path}: not a format Pillow reads ({error})") from error
    except OSError as error:
        raise ImageReadError(f"cannot decode image {path}: {error}") from error
    if mode == "RGB":
        return CodedImage(pixels.sum(axis=2, dtype=np.uint16), np.arange(3 * 255 + 1, dtype=np.float32) / 3 / 255)
    if mode == "L":
        return CodedImage(pixels, np.arange(256, dtype=np.float32) / 255)
    if mode.startswith("I;16") or mode == "I":
        if pixels.min() < 0 or pixels.max() > 65535:
            raise ImageReadError(f"cannot decode image {path}: integer pixels outside the 16-bit range")
        codes = pixels.astype(np.uint16)
        return CodedImage(codes, np.arange(int(codes.max()) + 1, dtype=np.float32) / 65535)
    raise ImageReadError(f"cannot decode image {path}: unsupported pixel mode {mode!r}")


def read_dicom(path: Path) -> CodedImage:
    """DICOM: the stored values (less the smallest, where negative) as codes, and their levels by
    `_grey_levels`."""
    dataset = _read_dataset(path)
    stored = _decode_pixels(dataset, path)
    _widen_bits_stored(dataset, stored, path)
    _check_value_transforms(dataset, path)
    low, high = min(int(stored.min()), 0), int(stored.max())
    if high - low >= 2**16:
        raise ImageReadError(
            f"DICOM {path}: its pixel values span {high - low + 1} values, more than the 16 bits XBench reads; "
            "store the image with 16 bits or fewer"
        )
    codes = stored if low == 0 else stored.astype(np.int32) - low
    codes = codes.astype(np.uint8 if high - low < 2**8 else np.uint16, copy=False)
    return CodedImage(codes, _grey_levels(np.arange(low, high + 1).astype(stored.dtype), dataset, path))


def _grey_levels(values: np.ndarray, dataset: pydicom.Dataset, path: Path) -> np.ndarray:
    """Stored values -> float32 in [0, 1], value by value: Modality LUT, then VOI LUT or window if
    present, then scaling over the output range of the last step (the VOI LUT's or window's output
    range, or the stored bit depth's range when there is neither), then MONOCHROME1 inversion."""
    try:
        values = apply_modality_lut(values, dataset)
        if "VOILUTSequence" in dataset:
            values = apply_voi(values, dataset)
            low, high = 0.0, float(2 ** int(dataset.VOILUTSequence[0].LUTDescriptor[2]) - 1)
        elif "WindowCenter" in dataset and "WindowWidth" in dataset:
            values = apply_windowing(values, dataset)
            low, high = _modality_output_range(dataset)  # pydicom's window maps below-window to `low`
        else:
            low, high = sorted(_modality_output_range(dataset))
    except (ValueError, TypeError, IndexError) as error:  # pydicom's own checks of the LUT and window elements
        raise ImageReadError(f"DICOM {path}: cannot apply its modality LUT, VOI LUT or window ({error})") from None
    if not (np.isfinite(high - low) and high > low):
        raise ImageReadError(
            f"DICOM {path}: its pixel values map onto the degenerate range [{low}, {high}] (Modality LUT, Rescale "
            "Slope/Intercept, VOI LUT or window): every pixel would read alike. Correct those elements."
        )
    image = np.asarray(values, dtype=np.float32)  # exact for stored integers; in-place from here on
    image -= low
    image /= high - low
    np.clip(image, 0, 1, out=image)
    if dataset.get("PhotometricInterpretation") == "MONOCHROME1":
        np.subtract(1, image, out=image)
    return image


def _read_dataset(path: Path) -> pydicom.Dataset:
    """``dcmread``, with a file that ends early as an error: pydicom only warns and drops the
    unfinished element (often the pixel data), which would read as "no pixel data"."""
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        try:
            dataset = pydicom.dcmread(path)
        except (InvalidDicomError, EOFError, OSError, ValueError) as error:
            raise ImageReadError(f"cannot read DICOM {path}: {error}") from error
    for warning in caught:
        if "end of file" in str(warning.message).lower():
            raise ImageReadError(
                f"DICOM {path} is truncated ({warning.message}); copy or download the file again"
            )
        warnings.warn_explicit(warning.message, warning.category, warning.filename, warning.lineno)
    if "PixelData" not in dataset:
        raise ImageReadError(f"DICOM {path} has no pixel data (no PixelData element)")
    return dataset


def _decode_pixels(dataset: pydicom.Dataset, path: Path) -> np.ndarray:
    """The stored values of the one grey frame; a missing codec or a corrupt stream is an error
    that says which."""
    syntax = dataset.file_meta.get("TransferSyntaxUID")
    if syntax is None:
        raise ImageReadError(f"DICOM {path} has no Transfer Syntax UID in its file meta: its pixel encoding is unknown")
    try:
        decoder = get_decoder(syntax)
    except NotImplementedError as error:
        raise ImageReadError(f"cannot decode {path}: pydicom has no decoder for its transfer syntax ({error})") from None
    if not decoder.is_available:
        needed = CODECS.get(syntax, "; ".join(decoder.missing_dependencies))
        raise ImageReadError(
            f"cannot decode {path}: its pixel data is {syntax.name} ({syntax}) and no codec for it is "
            f"installed; install {needed}"
        )
    try:
        stored = dataset.pixel_array
    except Exception as error:  # pydicom raises several types for a corrupt stream
        raise ImageReadError(
            f"cannot decode the pixel data of {path} ({syntax.name}): {error}. The file may be truncated "
            "or corrupt; copy or download it again"
        ) from error
    if stored.ndim != 2:
        raise ImageReadError(f"DICOM {path}: expected one grey frame, got pixel array of shape {stored.shape}")
    return stored


def _check_value_transforms(dataset: pydicom.Dataset, path: Path) -> None:
    """The elements that turn stored values into grey levels must describe an invertible map: a
    Rescale Slope of 0 (or not finite) makes every pixel NaN, a window of width 0 or a LUT of 0 bits
    or no entries a constant image. Each is an error naming the file and the element."""

    def numbers(keyword: str) -> list[float]:
        value = dataset.get(keyword)
        values = value if isinstance(value, (list, tuple, pydicom.multival.MultiValue)) else [value]
        return [float(v) for v in values if v is not None and str(v).strip() != ""]

    problems = []
    slope, intercept = numbers("RescaleSlope"), numbers("RescaleIntercept")
    if slope and not (np.isfinite(slope[0]) and slope[0] != 0):
        problems.append(f"Rescale Slope (0028,1053) is {slope[0]}; it must be finite and non-zero")
    if intercept and not np.isfinite(intercept[0]):
        problems.append(f"Rescale Intercept (0028,1052) is {intercept[0]}")
    if "VOILUTSequence" not in dataset and "WindowCenter" in dataset and "WindowWidth" in dataset:
        centre, width = numbers("WindowCenter"), numbers("WindowWidth")
        if not centre or not np.isfinite(centre[0]):
            problems.append(f"Window Center (0028,1050) is {dataset.WindowCenter}; it must be a finite number")
        if not width or not (np.isfinite(width[0]) and width[0] > 0):
            problems.append(f"Window Width (0028,1051) is {dataset.WindowWidth}; it must be a positive number")
    for keyword in ("ModalityLUTSequence", "VOILUTSequence"):
        if keyword in dataset:
            items = dataset[keyword].value
            lut = items[0] if items else None
            descriptor = list(lut.get("LUTDescriptor") or []) if lut is not None else []
            if len(descriptor) != 3 or not 1 <= int(descriptor[2]) <= 16 or not lut.get("LUTData"):
                problems.append(f"{keyword} holds no usable LUT (descriptor {descriptor}: entries, first value, bits "
                                "per entry 1-16; and LUT Data must not be empty)")
    if problems:
        raise ImageReadError(f"DICOM {path}: {'; '.join(problems)}. The image cannot be read as grey levels; correct "
                             "the file's header (or re-export it).")


def _widen_bits_stored(dataset: pydicom.Dataset, stored: np.ndarray, path: Path) -> None:
    """Raise *Bits Stored* to what the pixels need when they exceed it (a header that says 12 bits
    over 16-bit data), so the image is scaled over its real range instead of clipped to white."""
    declared = int(dataset.BitsStored)
    if dataset.PixelRepresentation == 0:
        needed = int(stored.max()).bit_length()
    else:
        needed = max(int(stored.max()).bit_length(), (-int(stored.min()) - 1).bit_length()) + 1
    if needed > declared:
        warnings.warn(
            f"DICOM {path}: pixel values need {needed} bits but Bits Stored says {declared}; scaling over "
            f"{needed} bits instead of clipping",
            stacklevel=3,
        )
        dataset.BitsStored = needed


def _modality_output_range(dataset: pydicom.Dataset) -> tuple[float, float]:
    """The values the Modality LUT step maps the stored range's ends to, exactly as pydicom's
    windowing computes its output range (so below-window pixels land on the first value)."""
    if "ModalityLUTSequence" in dataset:
        low, high = 0.0, float(2 ** int(dataset.ModalityLUTSequence[0].LUTDescriptor[2]) - 1)
    elif dataset.PixelRepresentation == 0:
        low, high = 0.0, float(2 ** int(dataset.BitsStored) - 1)
    else:
        low, high = float(-(2 ** (int(dataset.BitsStored) - 1))), float(2 ** (int(dataset.BitsStored) - 1) - 1)
    slope, intercept = dataset.get("RescaleSlope"), dataset.get("RescaleIntercept")
    if slope is not None and intercept is not None:
        low, high = low * float(slope) + float(intercept), high * float(slope) + float(intercept)
    return low, high
