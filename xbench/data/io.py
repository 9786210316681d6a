"""Reading radiographs: every loader goes through :func:`read_image`.

The result is always a float32 array [H, W] in [0, 1] at the file's native resolution, grey.
PNG and JPEG go through Pillow; DICOM through pydicom, with JPEG Baseline decoded by Pillow and
JPEG 2000 by pylibjpeg-openjpeg (both permissively licensed; the GPL pylibjpeg-libjpeg is not used).
"""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pydicom
from PIL import Image, UnidentifiedImageError
from pydicom.errors import InvalidDicomError
from pydicom.pixels import apply_modality_lut, apply_voi, apply_windowing

DICOM_SUFFIXES = (".dcm", ".dicom")


class ImageReadError(OSError):
    """An image file exists but cannot be decoded."""


def read_image(path: str | Path) -> np.ndarray:
    """Decode ``path`` into a float32 grey image in [0, 1] (PNG/JPEG, 8 or 16 bit)."""
    path = Path(path)
    if not path.is_file():
        raise FileNotFoundError(f"image not found: {path}")
    if path.suffix.lower() in DICOM_SUFFIXES:
        return read_dicom(path)
    return read_raster(path)


def read_raster(path: Path) -> np.ndarray:
    """PNG/JPEG through Pillow; 8-bit scales by 255, 16-bit by 65535; colour-stored grey averages."""
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
        return (pixels.astype(np.float32).mean(axis=2) / 255).astype(np.float32)
    if mode == "L":
        return pixels.astype(np.float32) / 255
    if mode.startswith("I;16") or mode == "I":
        if pixels.min() < 0 or pixels.max() > 65535:
            raise ImageReadError(f"cannot decode image {path}: integer pixels outside the 16-bit range")
        return pixels.astype(np.float32) / 65535
    raise ImageReadError(f"cannot decode image {path}: unsupported pixel mode {mode!r}")


def read_dicom(path: Path) -> np.ndarray:
    """DICOM -> [0, 1]: Modality LUT, then VOI LUT or window if present, then MONOCHROME1
    inversion, then scaling over the output range of the last step (the VOI LUT's or window's
    output range, or the stored bit depth's range when there is neither)."""
    try:
        dataset = pydicom.dcmread(path)
    except (InvalidDicomError, EOFError, OSError, ValueError) as error:
        raise ImageReadError(f"cannot read DICOM {path}: {error}") from error
    if "PixelData" not in dataset:
        raise ImageReadError(f"DICOM {path} has no pixel data (no PixelData element)")
    syntax = dataset.file_meta.get("TransferSyntaxUID")
    try:
        stored = dataset.pixel_array
    except Exception as error:
        name = f"{syntax.name} ({syntax})" if syntax is not None else "unknown"
        raise ImageReadError(
            f"cannot decode the pixel data of {path}, transfer syntax {name}: {error}. JPEG Baseline needs "
            "Pillow and JPEG 2000 needs pylibjpeg-openjpeg (both install with xbench)."
        ) from error
    if stored.ndim != 2:
        raise ImageReadError(f"DICOM {path}: expected one grey frame, got pixel array of shape {stored.shape}")
    values = apply_modality_lut(stored, dataset)
    low, high = _modality_range(dataset)
    if "VOILUTSequence" in dataset:
        values = apply_voi(values, dataset)
        low, high = 0.0, float(2 ** int(dataset.VOILUTSequence[0].LUTDescriptor[2]) - 1)
    elif "WindowCenter" in dataset and "WindowWidth" in dataset:
        values = apply_windowing(values, dataset)  # maps onto the same modality range
    values = values.astype(np.float64)
    if dataset.get("PhotometricInterpretation") == "MONOCHROME1":
        values = low + high - values
    return np.clip((values - low) / (high - low), 0, 1).astype(np.float32)


def _modality_range(dataset) -> tuple[float, float]:
    """The range the Modality LUT step can output (pydicom's rule for the windowing output range)."""
    if "ModalityLUTSequence" in dataset:
        return 0.0, float(2 ** int(dataset.ModalityLUTSequence[0].LUTDescriptor[2]) - 1)
    bits = int(dataset.BitsStored)
    if dataset.PixelRepresentation == 0:
        low, high = 0.0, float(2**bits - 1)
    else:
        low, high = float(-(2 ** (bits - 1))), float(2 ** (bits - 1) - 1)
    slope, intercept = dataset.get("RescaleSlope"), dataset.get("RescaleIntercept")
    if slope is not None and intercept is not None:
        low, high = sorted((low * float(slope) + float(intercept), high * float(slope) + float(intercept)))
    return low, high
