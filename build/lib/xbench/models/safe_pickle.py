"""Read pickles that may only hold data: tensors, arrays, numbers, strings and containers.

``pickle.load`` calls whatever globals a file names, so a pickle from elsewhere can run code.
:class:`DataUnpickler` admits only the globals that rebuild tensors and NumPy arrays (tensor
storages are themselves read with ``torch.load(weights_only=True)``); any other global is refused
before it is imported or called. Built for cheXlocalize's map pickles (``pickle.dump`` of a dict
with a tensor map), which name exactly ``torch._utils._rebuild_tensor_v2``,
``torch.storage._load_from_bytes`` and ``collections.OrderedDict``.
"""

from __future__ import annotations

import collections
import io
import pickle
from pathlib import Path

import numpy as np
import torch


def _storage_from_bytes(data: bytes):
    """What ``torch.storage._load_from_bytes`` does, restricted to weights and mapped to the CPU."""
    return torch.load(io.BytesIO(data), map_location="cpu", weights_only=True)


def _numpy_reconstruct():
    try:
        from numpy._core.multiarray import _reconstruct, scalar
    except ImportError:  # NumPy 1.x
        from numpy.core.multiarray import _reconstruct, scalar
    return _reconstruct, scalar


_RECONSTRUCT, _SCALAR = _numpy_reconstruct()
#: (module, name) a data pickle may name -> the object it gets.
ALLOWED_GLOBALS = {
    ("collections", "OrderedDict"): collections.OrderedDict,
    ("torch._utils", "_rebuild_tensor_v2"): torch._utils._rebuild_tensor_v2,
    ("torch.storage", "_load_from_bytes"): _storage_from_bytes,
    ("numpy", "ndarray"): np.ndarray,
    ("numpy", "dtype"): np.dtype,
    ("numpy.core.multiarray", "_reconstruct"): _RECONSTRUCT,
    ("numpy._core.multiarray", "_reconstruct"): _RECONSTRUCT,
    ("numpy.core.multiarray", "scalar"): _SCALAR,
    ("numpy._core.multiarray", "scalar"): _SCALAR,
}


class DataUnpickler(pickle.Unpickler):
    """A ``pickle.Unpickler`` that resolves only :data:`ALLOWED_GLOBALS` and names the file it refuses."""

    def __init__(self, file, source: str) -> None:
        super().__init__(file)
        self.source = source

    def find_class(self, module: str, name: str):
        allowed = ALLOWED_GLOBALS.get((module, name))
        if allowed is None:
            raise pickle.UnpicklingError(
                f"{self.source}: the pickle names {module}.{name}, which is not data; only tensors, NumPy arrays, "
                "numbers, strings and containers are read (nothing in the file was run). Save maps as "
                ".npz or .safetensors instead."
            )
        return allowed

    def persistent_load(self, pid):
        raise pickle.UnpicklingError(f"{self.source}: persistent ids are not data (a torch.save archive? use torch.load)")


def load_data_pickle(path: Path):
    """The object in the pickle at ``path``, rebuilt by :class:`DataUnpickler`."""
    with open(path, "rb") as handle:
        return DataUnpickler(handle, str(path)).load()
