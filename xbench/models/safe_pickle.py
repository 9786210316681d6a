"""Read pickles that may only hold data: tensors, NumPy arrays and dtypes, numbers (int, float, bool,
NumPy scalars), strings, bytes and containers (tuple, list, dict, ``OrderedDict``, set, frozenset),
written with any pickle protocol, 0 to 5.

``pickle.load`` calls whatever globals a file names, so a pickle from elsewhere can run code; and
its BUILD, SETITEM(S), APPEND(S) and ADDITEMS steps change whatever object they are given, an
imported function or class included (a 20-byte pickle can set ``__defaults__`` on torch's tensor
rebuilder and so change every tensor loaded after it). [`DataUnpickler`][xbench.models.safe_pickle.DataUnpickler]
admits data only:

- a file may name only [`ALLOWED_GLOBALS`][xbench.models.safe_pickle.ALLOWED_GLOBALS], and each name
  resolves to a builder here, never to the library's own object; the builders check their arguments
  and always return a new object (tensor storages are read with ``torch.load(weights_only=True)``);
  protocols 0 to 2 store bytes as ``_codecs.encode(text, "latin1")`` and sets as ``set(list)``,
  which are admitted in exactly that form;
- a file may call (REDUCE) only those builders; NEWOBJ, OBJ, INST and extension codes are refused;
- BUILD sets state only on a NumPy array or dtype the file itself built, with a dtype that holds
  no Python objects; SETITEM(S), APPEND(S) and ADDITEMS fill only a dict, list or set the file built.

Nothing outside the returned object can change. A length the file claims (of bytes, a string, a
frame) beyond the file's end is refused before anything is allocated for it, and a file that ends
inside the pickle is named as truncated. Built for cheXlocalize's map pickles
(``pickle.dump`` of a dict with a tensor map), which name exactly ``torch._utils._rebuild_tensor_v2``,
``torch.storage._load_from_bytes`` and ``collections.OrderedDict``; NumPy arrays and scalars load too.
"""

from __future__ import annotations

import collections
import io
import math
import pickle
import struct
from pathlib import Path

import numpy as np
import torch

from xbench.files import regular_file


class _Refused(Exception):
    """A builder's arguments are not the data it builds from (becomes an UnpicklingError naming the file)."""


def _numpy_reconstruct():
    try:
        from numpy._core.multiarray import _reconstruct, scalar
    except ImportError:  # NumPy 1.x
        from numpy.core.multiarray import _reconstruct, scalar
    return _reconstruct, scalar


_RECONSTRUCT, _SCALAR = _numpy_reconstruct()


def _plain_dtype(dtype) -> np.dtype:
    if not isinstance(dtype, np.dtype) or dtype.hasobject:
        raise _Refused(f"a NumPy dtype of numbers is expected, got {dtype!r}")
    return dtype


def _ordered_dict(*args) -> collections.OrderedDict:
    return collections.OrderedDict(*args)


def _storage_from_bytes(data) -> torch.TypedStorage:
    """What ``torch.storage._load_from_bytes`` does, restricted to weights and mapped to the CPU."""
    if type(data) is not bytes:
        raise _Refused(f"a tensor storage is read from bytes, got {type(data).__name__}")
    storage = torch.load(io.BytesIO(data), map_location="cpu", weights_only=True)
    if not isinstance(storage, torch.TypedStorage):
        raise _Refused(f"the bytes of a tensor storage hold a {type(storage).__name__}")
    return storage


def _tensor(storage, storage_offset, size, stride, requires_grad, backward_hooks, metadata=None) -> torch.Tensor:
    """``torch._utils._rebuild_tensor_v2`` for plain tensors: a view of a storage this file holds,
    with no gradient, no hooks and no metadata (conjugate or negative bits)."""
    if not isinstance(storage, torch.TypedStorage):
        raise _Refused(f"a tensor is rebuilt from a storage, got {type(storage).__name__}")
    if requires_grad is not False or backward_hooks or metadata:
        raise _Refused("a tensor with gradient, hooks or metadata is not plain data")
    integers = (storage_offset, *size, *stride)
    if not all(type(v) is int for v in integers) or len(size) != len(stride):
        raise _Refused(f"a tensor's offset, size and stride must be integers; got {storage_offset}, {size}, {stride}")
    if math.prod(size) > storage._size():
        raise _Refused(f"a tensor of {math.prod(size):,} elements over a storage of {storage._size():,} claims more "
                       "numbers than the file holds (save tensor.contiguous())")
    return torch._utils._rebuild_tensor(storage, storage_offset, tuple(size), tuple(stride))


def _array(subtype, shape, typecode) -> np.ndarray:
    """``numpy._core.multiarray._reconstruct`` as ``ndarray.__reduce__`` calls it: an empty array for
    BUILD to fill (its shape and numbers come with BUILD)."""
    if subtype is not np.ndarray:
        raise _Refused(f"only numpy.ndarray arrays are data, got {subtype!r}")
    if shape != (0,) or typecode != b"b":
        raise _Refused(f"an array starts empty, as (0,) of b'b'; got {shape!r:.40} of {typecode!r:.20}")
    return _RECONSTRUCT(np.ndarray, shape, typecode)


def _from_buffer(buffer, dtype, shape, order) -> np.ndarray:
    """``numpy._core.numeric._frombuffer`` (protocol 5's arrays): a copy of the file's bytes as an array."""
    if type(buffer) not in (bytes, bytearray) or order not in ("C", "F"):
        raise _Refused(f"an array is built from bytes in C or F order, got {type(buffer).__name__}, {order!r}")
    return np.frombuffer(buffer, dtype=_plain_dtype(dtype)).reshape(shape, order=order).copy(order=order)


def _dtype(spec, align=False, copy=False) -> np.dtype:
    """``numpy.dtype`` from a type string, always a new instance (never NumPy's shared one)."""
    if type(spec) is not str:
        raise _Refused(f"a dtype is built from a type string, got {type(spec).__name__}")
    return _plain_dtype(np.dtype(spec, bool(align), True))


def _scalar(dtype, data) -> np.generic:
    if type(data) is not bytes:
        raise _Refused(f"a NumPy scalar is built from bytes, got {type(data).__name__}")
    return _SCALAR(_plain_dtype(dtype), data)


def _latin1_bytes(text, encoding) -> bytes:
    """``_codecs.encode(text, "latin1")``, exactly as protocols 0 to 2 store bytes: each byte as the
    character of the same code point."""
    if type(text) is not str or type(encoding) is not str or encoding != "latin1":
        raise _Refused(f"_codecs.encode is admitted only as pickle stores bytes, (str, 'latin1'); got "
                       f"({type(text).__name__}, {encoding!r:.20})")
    return text.encode("latin1")


def _empty_bytes() -> bytes:
    """``bytes()``: how protocols 0 to 2 store empty bytes."""
    return b""


def _set(items) -> set:
    """``set(list)``: how protocols 0 to 3 store a set."""
    if type(items) is not list:
        raise _Refused(f"a set is built from a list, got {type(items).__name__}")
    return set(items)


def _frozenset(items) -> frozenset:
    """``frozenset(list)``: how protocols 0 to 3 store a frozenset."""
    if type(items) is not list:
        raise _Refused(f"a frozenset is built from a list, got {type(items).__name__}")
    return frozenset(items)


#: (module, name) a data pickle may name -> what it gets: a builder above, or NumPy's array class
#: (only as the argument that says which array ``_reconstruct`` builds).
ALLOWED_GLOBALS = {
    ("collections", "OrderedDict"): _ordered_dict,
    ("torch._utils", "_rebuild_tensor_v2"): _tensor,
    ("torch.storage", "_load_from_bytes"): _storage_from_bytes,
    ("numpy", "ndarray"): np.ndarray,
    ("numpy", "dtype"): _dtype,
    ("numpy.core.multiarray", "_reconstruct"): _array,
    ("numpy._core.multiarray", "_reconstruct"): _array,
    ("numpy.core.numeric", "_frombuffer"): _from_buffer,
    ("numpy._core.numeric", "_frombuffer"): _from_buffer,
    ("numpy.core.multiarray", "scalar"): _scalar,
    ("numpy._core.multiarray", "scalar"): _scalar,
    ("_codecs", "encode"): _latin1_bytes,
    # protocols 0 to 2 write Python 2's module name, __builtin__, unless told not to
    ("__builtin__", "bytes"): _empty_bytes,
    ("builtins", "bytes"): _empty_bytes,
    ("__builtin__", "set"): _set,
    ("builtins", "set"): _set,
    ("__builtin__", "frozenset"): _frozenset,
    ("builtins", "frozenset"): _frozenset,
}
#: The builders a pickle may call: every allowed name's, but ``np.ndarray``, which a pickle names only
#: as the array builder's argument.
BUILDERS = tuple(dict.fromkeys(builder for builder in ALLOWED_GLOBALS.values() if builder is not np.ndarray))


class _FileReads:
    """A pickle file's reads, each checked against the file's end before anything is read: a length
    the pickle states beyond it (a 30-byte file claiming 2**62 bytes) is refused, not allocated, and
    so is a file that ends inside the pickle."""

    def __init__(self, file, source: str) -> None:
        self.file, self.source = file, source
        start = file.tell()
        self.end = file.seek(0, io.SEEK_END)
        file.seek(start)

    def read(self, size: int) -> bytes:
        position = self.file.tell()
        if position + size > self.end:
            self.beyond_end(f"{size:,} byte{'' if size == 1 else 's'} at byte {position:,}")
        return self.file.read(size)

    def readline(self) -> bytes:
        line = self.file.readline()
        if not line.endswith(b"\n"):
            self.beyond_end(f"a line from byte {self.file.tell() - len(line):,}")
        return line

    def beyond_end(self, asked: str) -> None:
        """Refuse what the pickle ``asked`` for past the file's end."""
        ends = "is empty" if not self.end else f"ends at byte {self.end:,}"
        raise pickle.UnpicklingError(f"{self.source} {ends}, where the pickle asks for {asked}: it is truncated or "
                                     "damaged (a length it states is wrong); save it again")


_dispatch = pickle._Unpickler.dispatch  # noqa: SLF001 -- the pure-Python unpickler's opcode table


class DataUnpickler(pickle._Unpickler):  # noqa: SLF001
    """An unpickler that builds data only (see the module docstring) and names the file it refuses."""

    dispatch = dict(_dispatch)

    def __init__(self, file, source: str) -> None:
        self.reads = _FileReads(file, source)
        super().__init__(self.reads)
        self.source = source
        self.built: dict[int, object] = {}  # id -> every object a builder made for this file (kept alive)

    def refuse(self, what: str) -> pickle.UnpicklingError:
        return pickle.UnpicklingError(
            f"{self.source}: {what}, which is not data; only tensors, NumPy arrays, numbers, strings and "
            "containers are read (nothing in the file was run or changed). Save maps as .npz or .safetensors instead."
        )

    def find_class(self, module: str, name: str):
        allowed = ALLOWED_GLOBALS.get((module, name))
        if allowed is None:
            raise self.refuse(f"the pickle names {module}.{name}")
        return allowed

    def persistent_load(self, pid):
        raise pickle.UnpicklingError(f"{self.source}: persistent ids are not data (a torch.save archive? use torch.load)")

    def load_reduce(self) -> None:
        args = self.stack.pop()
        builder = self.stack[-1]
        if not any(builder is allowed for allowed in BUILDERS) or type(args) is not tuple:
            raise self.refuse(f"the pickle calls {getattr(builder, '__name__', type(builder).__name__)}")
        try:
            built = builder(*args)
        except (_Refused, TypeError, ValueError, RuntimeError) as error:
            raise self.refuse(f"the pickle builds {builder.__name__[1:]} from other things ({error})") from None
        self.built[id(built)] = built
        self.stack[-1] = built

    def load_build(self) -> None:
        state = self.stack.pop()
        target = self.stack[-1]
        if id(target) not in self.built or not (type(target) is np.ndarray or isinstance(target, np.dtype)):
            raise self.refuse(f"the pickle sets the state of {type(target).__name__} {target!r:.60}")
        if type(target) is np.ndarray and not (type(state) is tuple and len(state) == 5
                                               and isinstance(state[2], np.dtype) and not state[2].hasobject):
            raise self.refuse("the pickle fills an array with Python objects")
        try:
            target.__setstate__(state)
        except (TypeError, ValueError) as error:
            raise self.refuse(f"the pickle sets a malformed state on {type(target).__name__} ({error})") from None
        if isinstance(target, np.dtype) and target.hasobject:
            raise self.refuse("the pickle makes a dtype that holds Python objects")

    def _container(self, target, kinds: tuple[type, ...], step: str) -> None:
        if type(target) not in kinds:
            raise self.refuse(f"the pickle's {step} step changes {type(target).__name__} {target!r:.60}")

    def load_setitem(self) -> None:
        self._container(self.stack[-3], (dict, collections.OrderedDict), "SETITEM")
        _dispatch[pickle.SETITEM[0]](self)

    def load_setitems(self) -> None:
        self._container(self.metastack[-1][-1], (dict, collections.OrderedDict), "SETITEMS")
        _dispatch[pickle.SETITEMS[0]](self)

    def load_append(self) -> None:
        self._container(self.stack[-2], (list,), "APPEND")
        _dispatch[pickle.APPEND[0]](self)

    def load_appends(self) -> None:
        self._container(self.metastack[-1][-1], (list,), "APPENDS")
        _dispatch[pickle.APPENDS[0]](self)

    def load_additems(self) -> None:
        self._container(self.metastack[-1][-1], (set,), "ADDITEMS")
        _dispatch[pickle.ADDITEMS[0]](self)

    def load_bytearray8(self) -> None:
        """BYTEARRAY8, its length checked before the bytearray is made (the library allocates first)."""
        (size,) = struct.unpack("<Q", self.read(8))
        if size > self.reads.end:  # the file's size: inside a frame, the bytes were read with the frame
            self.reads.beyond_end(f"a bytearray of {size:,} bytes")
        self.append(bytearray(self.read(size)))

    def load_not_data(self) -> None:
        raise self.refuse("the pickle makes an object of a class (NEWOBJ, OBJ, INST or an extension code)")

    dispatch[pickle.REDUCE[0]] = load_reduce
    dispatch[pickle.BUILD[0]] = load_build
    dispatch[pickle.SETITEM[0]] = load_setitem
    dispatch[pickle.SETITEMS[0]] = load_setitems
    dispatch[pickle.APPEND[0]] = load_append
    dispatch[pickle.APPENDS[0]] = load_appends
    dispatch[pickle.ADDITEMS[0]] = load_additems
    dispatch[pickle.BYTEARRAY8[0]] = load_bytearray8
    for _opcode in (pickle.NEWOBJ, pickle.NEWOBJ_EX, pickle.OBJ, pickle.INST, pickle.EXT1, pickle.EXT2, pickle.EXT4):
        dispatch[_opcode[0]] = load_not_data
    del _opcode


def load_data_pickle(path: Path):
    """The object in the pickle at ``path``, rebuilt by [`DataUnpickler`][xbench.models.safe_pickle.DataUnpickler];
    a file that is not a pickle, or a damaged one, is an error naming it, whatever failed (memory included)."""
    with open(regular_file(path), "rb") as handle:
        try:
            return DataUnpickler(handle, str(path)).load()
        except pickle.UnpicklingError as error:
            if str(error).startswith(str(path)):
                raise
            raise pickle.UnpicklingError(f"{path} is not a readable pickle ({error}); save it again") from None
        except Exception as error:  # noqa: BLE001 -- a damaged file can fail anywhere (memory and recursion included)
            raise pickle.UnpicklingError(
                f"{path} is not a readable pickle ({type(error).__name__}: {error}); it may be truncated or damaged, "
                "save it again") from None
