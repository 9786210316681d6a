"""The data unpickler reads every documented type at every pickle protocol, and changes nothing
outside what it returns (its refusals: tests/test_bad_inputs.py)."""

from __future__ import annotations

import collections
import copyreg
import pickle
import random
import sys
import warnings

import numpy as np
import pytest
import torch

from xbench.models import safe_pickle
from xbench.models.safe_pickle import load_data_pickle

#: One value of each documented type (the module docstring's list), as a saved-maps pickle holds them.
DOCUMENTED = {
    "tensor view": torch.arange(6.0).reshape(1, 1, 2, 3)[..., 1:],
    "0-d tensor": torch.tensor(0.25),
    "half tensor": torch.ones(2, 3, dtype=torch.float16),
    "bool tensor": torch.tensor([True, False]),
    "int16 array": np.arange(4, dtype=np.int16),
    "Fortran array": np.asfortranarray(np.arange(6, dtype=np.float32).reshape(2, 3)),
    "empty array": np.zeros((0, 2), dtype=np.uint8),
    "dtype": np.dtype("f4"),
    "float64 scalar": np.float64(1.5),
    "complex64 scalar": np.complex64(1 - 2j),
    "int": -5,
    "big int": 2**70,
    "float": 2.5,
    "bool": True,
    "None": None,
    "str": "Edema é",
    "bytes": b"ab\xff\x00",
    "empty bytes": b"",
    "tuple": (3, 2),
    "list": [1, [2.5, None]],
    "dict": {"a": 1},
    "OrderedDict": collections.OrderedDict(b=2, a=1),
    "set": {1, 2},
    "empty set": set(),
    "frozenset": frozenset({"x"}),
}


def same(loaded, saved) -> bool:
    """Equal values of the same type (tensors and arrays: dtype, shape, memory order and numbers)."""
    if type(loaded) is not type(saved):
        return False
    if isinstance(saved, torch.Tensor):
        return loaded.dtype == saved.dtype and loaded.equal(saved)
    if isinstance(saved, np.ndarray):
        return (loaded.dtype == saved.dtype and loaded.shape == saved.shape and np.array_equal(loaded, saved)
                and loaded.flags.f_contiguous == saved.flags.f_contiguous)
    return loaded == saved


@pytest.mark.parametrize("fix_imports", [True, False], ids=["__builtin__", "builtins"])
@pytest.mark.parametrize("protocol", range(pickle.HIGHEST_PROTOCOL + 1))
def test_every_documented_type_round_trips_at_every_protocol(tmp_path, protocol, fix_imports):
    """Protocols 0 to 2 store bytes as ``_codecs.encode(str, 'latin1')`` (and NumPy's and torch's
    bytes with them), 0 to 3 sets as ``set(list)``; 0 to 2 name Python 2's ``__builtin__`` unless
    ``fix_imports`` is off. The reference is the library's own unpickler on the same bytes."""
    path = tmp_path / "x_Edema_map.pkl"
    path.write_bytes(pickle.dumps(DOCUMENTED, protocol=protocol, fix_imports=fix_imports))
    loaded, reference = load_data_pickle(path), pickle.loads(path.read_bytes())
    assert list(loaded) == list(DOCUMENTED)
    assert [name for name in DOCUMENTED if not same(loaded[name], reference[name])] == []
    assert all(same(reference[name], value) for name, value in DOCUMENTED.items())


def _state() -> dict:
    """What loading data could change outside the loaded object: random generators, defaults,
    registries, imported modules, warning filters, the library unpickler's table, the builders."""
    return {
        "torch rng": torch.random.get_rng_state(),
        "numpy rng": np.random.get_state()[1].copy(),
        "python rng": random.getstate(),
        "default dtype": torch.get_default_dtype(),
        "modules": dict(sys.modules),
        "warning filters": list(warnings.filters),
        "unpickler table": dict(pickle._Unpickler.dispatch),
        "copyreg": (dict(copyreg.dispatch_table), dict(copyreg._extension_registry)),
        "allowed": dict(safe_pickle.ALLOWED_GLOBALS),
        "builders": [(b.__defaults__, b.__kwdefaults__, dict(vars(b))) for b in safe_pickle.BUILDERS],
        "dispatch": dict(safe_pickle.DataUnpickler.dispatch),
    }


def _unchanged(before, after) -> bool:
    if isinstance(before, torch.Tensor):
        return before.equal(after)
    if isinstance(before, np.ndarray):
        return np.array_equal(before, after)
    return before == after


def test_loading_changes_nothing_outside_what_it_returns(tmp_path):
    """Loading every documented type at every protocol (torch.load of the storages, NumPy's BUILD
    included) leaves the process as it was; modules a library imports lazily may be added."""
    for protocol in range(pickle.HIGHEST_PROTOCOL + 1):
        (tmp_path / f"{protocol}.pkl").write_bytes(pickle.dumps(DOCUMENTED, protocol=protocol))
    before = _state()
    for protocol in range(pickle.HIGHEST_PROTOCOL + 1):
        load_data_pickle(tmp_path / f"{protocol}.pkl")
    after = _state()
    modules_before, modules_after = before.pop("modules"), after.pop("modules")
    assert [key for key in before if not _unchanged(before[key], after[key])] == []
    assert [name for name, module in modules_before.items() if modules_after.get(name) is not module] == []
