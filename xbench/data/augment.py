"""Augmentations for robustness studies: one albumentations pipeline over image and masks together.

The pipeline runs at the image's native size, after decoding and rasterising and before the batch
geometry is fixed, so masks then go through the usual area-resize, gamma binarisation and
never-vanish rule. It is seeded per sample from ``(seed, sample index)``: runs repeat exactly, and
every model and every process count sees the same perturbed images.

A pipeline is given in YAML either in albumentations' own serialised form (what
``albumentations.to_dict`` writes) or as a list of ``class_path`` / ``init_args`` entries naming
albumentations transforms.
"""

from __future__ import annotations

import warnings

import albumentations as A
import numpy as np

from xbench.seeds import sample_seed

AugmentConfig = list[dict] | dict


def build_pipeline(config: AugmentConfig) -> A.Compose:
    """An albumentations ``Compose`` from its YAML form; errors name the offending entry."""
    if isinstance(config, dict):
        if "transform" not in config:
            raise ValueError(
                "augment: a mapping must be albumentations' serialised form (with a 'transform' key, as "
                "albumentations.to_dict writes); otherwise give a list of class_path/init_args entries"
            )
        try:
            pipeline = A.from_dict(config)
        except Exception as error:
            raise ValueError(f"augment: cannot build the serialised albumentations pipeline: {error}") from error
        return pipeline if isinstance(pipeline, A.Compose) else A.Compose([pipeline])
    if not isinstance(config, list) or not config:
        raise ValueError(f"augment must be a non-empty list of class_path/init_args entries; got {config!r}")
    return A.Compose([_build_entry(i, entry) for i, entry in enumerate(config)])


def _build_entry(position: int, entry) -> A.BasicTransform:
    where = f"augment entry {position}"
    if not isinstance(entry, dict) or "class_path" not in entry:
        raise ValueError(f"{where}: expected a mapping with 'class_path' (and optional 'init_args'); got {entry!r}")
    class_path = str(entry["class_path"])
    module, _, name = class_path.rpartition(".")
    transform = getattr(A, name, None)
    if module not in ("", "albumentations") or not (
        isinstance(transform, type) and issubclass(transform, A.BasicTransform)
    ):
        raise ValueError(f"{where}: {class_path!r} is not an albumentations transform (e.g. albumentations.Rotate)")
    try:
        # albumentations validates arguments with pydantic but only warns about unknown ones
        with warnings.catch_warnings():
            warnings.simplefilter("error")
            return transform(**(entry.get("init_args") or {}))
    except Exception as error:
        raise ValueError(f"{where} ({class_path}): invalid arguments: {error}") from error


def augment_sample(
    pipeline: A.Compose, seed: int, index: int, image: np.ndarray, masks: list[np.ndarray]
) -> tuple[np.ndarray, list[np.ndarray]]:
    """Apply ``pipeline`` to a float image in [0, 1] and its bool masks, reproducibly per sample."""
    pipeline.set_random_seed(sample_seed(seed, index))
    out = pipeline(image=image, masks=[mask.astype(np.uint8) for mask in masks])
    augmented = np.clip(out["image"], 0, 1).astype(np.float32)
    if augmented.ndim != 2:
        raise ValueError(f"augment: the pipeline must keep the image grey [H, W]; it returned {augmented.shape}")
    return augmented, [np.asarray(mask).astype(bool) for mask in out["masks"]]
