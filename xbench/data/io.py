"""Reading radiographs: every loader goes through :func:`read_image`.

The result is always a float32 array [H, W] in [0, 1] at the file's native resolution, grey.
"""

from __future__ import annotations

from pathlib import Path

import numpy as np
from PIL import Image, UnidentifiedImageError


class ImageReadError(OSError):
    """An image file exists but cannot be decoded."""


def read_image(path: str | Path) -> np.ndarray:
    """Decode ``path`` into a float32 grey image in [0, 1] (PNG/JPEG, 8 or 16 bit)."""
    path = Path(path)
    if not path.is_file():
        raise FileNotFoundError(f"image not found: {path}")
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
