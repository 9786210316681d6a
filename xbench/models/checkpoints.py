"""Loading the authors' checkpoints: safely, strictly, with every rename declared.

- [`safe_load`][xbench.models.checkpoints.safe_load] never runs code from a pickle. It uses torch's
  ``weights_only`` unpickler; any class or function the file refers to beyond tensors and containers
  (an OmegaConf config, a Lightning callback, an ``argparse.Namespace``) becomes an `InertObject`
  that only records its name, arguments and state.
- [`CheckpointLayout`][xbench.models.checkpoints.CheckpointLayout] says, as data next to each model,
  where the state dict sits in the file, which prefix every key carries and which keys may be
  dropped (each with a reason and a check).
  [`load_checkpoint`][xbench.models.checkpoints.load_checkpoint] applies it and loads with exact key
  and shape matching; any difference raises
  [`CheckpointMismatchError`][xbench.models.checkpoints.CheckpointMismatchError], which lists
  missing, unexpected and reshaped keys grouped by prefix. `load_state_dicts` does the same for a
  file that holds several state dicts (KAD: ``image_encoder``, ``text_encoder``, ``model``), with
  one error for all.
- `read_hyper_parameters` compares the training config a Lightning file carries with the
  values a model hard-codes (CARZero, GLoRIA).
- A tensor the module registers under two names (a submodule reused inside another) must hold
  the same values under both names in the file; it is checked, not silently overwritten.
- Every model's ``checkpoint_dir`` is first resolved by
  [`checkpoint_folder`][xbench.models.hub.checkpoint_folder] (a folder, or a hub id in the local
  Hugging Face cache).
"""

from __future__ import annotations

import warnings
from collections import defaultdict
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import torch
from torch import Tensor, nn

from xbench.files import present, regular_file
from xbench.models.hub import missing_files_fix


class InertObject:
    """Stand-in for a pickled object whose class is not loaded: holds name, arguments and state.

    Arguments are recorded in ``__new__``: pickle builds most objects by calling ``cls.__new__``
    alone (protocol 2's ``NEWOBJ``, e.g. an OmegaConf ``DictConfig``), never ``__init__``.
    """

    qualified_name = "?"

    def __new__(cls, *args: Any, **kwargs: Any) -> InertObject:
        placeholder = super().__new__(cls)
        placeholder.args = args
        placeholder.kwargs = kwargs
        placeholder.state = None
        return placeholder

    def __setstate__(self, state: Any) -> None:
        self.state = state

    def __repr__(self) -> str:
        return f"<inert {self.qualified_name}>"


def _inert_class(qualified_name: str) -> type[InertObject]:
    return type(qualified_name.rsplit(".", 1)[-1], (InertObject,), {"qualified_name": qualified_name})


def safe_load(path: str | Path) -> Any:
    """Load a checkpoint file without executing code from it (see the module docstring); a named
    pipe, a device or a folder in its place is named before anything opens it."""
    try:
        path = regular_file(path)
    except FileNotFoundError:
        raise FileNotFoundError(f"checkpoint not found: {path}") from None
    size = path.stat().st_size
    if size == 0:
        raise ValueError(f"checkpoint {path} is empty (0 bytes): the download or copy did not finish; fetch it again")
    if path.suffix == ".safetensors":
        from safetensors.torch import load_file

        try:
            return load_file(str(path))
        except Exception as error:  # noqa: BLE001 -- safetensors raises its own error type for a bad header
            raise damaged_safetensors(path, error) from error
    with open(path, "rb") as handle:
        head = handle.read(2)
    if head != b"PK" and head[:1] != b"\x80":  # a zip (torch >= 1.6) or a pickle (older torch.save)
        raise ValueError(
            f"{path} is not a PyTorch checkpoint (it starts with {head!r}, neither a zip archive nor a pickle; "
            f"{size} bytes): was an HTML error page or a Git LFS pointer saved in its place? Fetch the file again"
        )
    try:
        unknown = torch.serialization.get_unsafe_globals_in_checkpoint(str(path))
    except Exception:  # not a zip checkpoint; torch.load below says what it is
        unknown = []
    placeholders = [(_inert_class(name), name) for name in unknown]
    try:
        with torch.serialization.safe_globals(placeholders):
            return torch.load(path, map_location="cpu", weights_only=True)
    except Exception as error:  # a corrupt or foreign file: say which and why
        raise ValueError(f"cannot read checkpoint {path}: {error}") from error


def damaged_safetensors(path: Path, error: Exception) -> ValueError:
    """The error for a ``.safetensors`` file that safetensors cannot read: the file, safetensors' reason, the fix."""
    return ValueError(f"cannot read checkpoint {path} ({type(error).__name__}: {error}): a damaged or truncated "
                      ".safetensors file; fetch it again")


def check_safetensors(path: Path) -> None:
    """Read ``path``'s header, which also checks that its tensors fill the file exactly: a damaged or
    truncated file is named here, before a loader that would not name it (transformers) reads it."""
    from safetensors import safe_open

    try:
        with safe_open(str(regular_file(path)), framework="pt"):
            pass
    except Exception as error:  # noqa: BLE001 -- safetensors raises its own error type for a bad header
        raise damaged_safetensors(path, error) from error


def require_finite(state: Mapping[str, Tensor], where: str) -> None:
    """Every floating-point tensor of ``state`` finite: a NaN or inf in the weights is named (the
    tensors and ``where``) when they are loaded, not met later as non-finite outputs."""
    damaged = [key for key, tensor in state.items() if tensor.is_floating_point() and not torch.isfinite(tensor).all()]
    if damaged:
        raise ValueError(f"{where}: NaN or inf in {group_keys(damaged)}: the weights are damaged (or saved from a "
                         "diverged training); fetch the checkpoint again")


def omegaconf_values(node: Any) -> Any:
    """Plain dicts, lists and values out of an inert OmegaConf ``DictConfig``/``ListConfig``.

    OmegaConf pickles a container with its children under ``_content`` and a leaf node with its
    value under ``_val``; both survive in the placeholder's ``state``. Plain containers (what newer
    Lightning versions save) pass through. Anything else raises ``ValueError``.
    """
    if isinstance(node, InertObject):
        state = node.state if node.qualified_name.startswith("omegaconf.") else None
        if isinstance(state, Mapping) and "_content" in state:
            return omegaconf_values(state["_content"])
        if isinstance(state, Mapping) and "_val" in state:
            return omegaconf_values(state["_val"])
        raise ValueError(f"{node!r} is not an OmegaConf container or value")
    if isinstance(node, Mapping):
        return {key: omegaconf_values(value) for key, value in node.items()}
    if isinstance(node, (list, tuple)):
        return [omegaconf_values(value) for value in node]
    if node is None or isinstance(node, (str, int, float, bool)):
        return node
    raise ValueError(f"{type(node).__name__} {node!r} is not a configuration value")


@dataclass(frozen=True)
class DeclaredDrop:
    """A key the authors' file carries that the module does not, dropped for a stated reason."""

    key: str
    reason: str
    #: Run on the dropped tensor; False means the file is not what we think it is.
    check: Callable[[Tensor], bool] | None = None


def is_arange(tensor: Tensor) -> bool:
    """the values arange(n)"""  # the docstring is what a failed check reports it expected
    flat = tensor.reshape(-1)
    return bool(torch.equal(flat.long(), torch.arange(flat.numel())))


def has_shape(*shape: int) -> Callable[[Tensor], bool]:
    """A drop check: the dropped tensor has exactly this shape (``()`` for a scalar)."""

    def check(tensor: Tensor) -> bool:
        return tuple(tensor.shape) == shape

    check.__doc__ = f"the shape {list(shape)}"
    return check


@dataclass(frozen=True)
class CheckpointLayout:
    """Where a model's weights sit in its authors' file and how its keys map onto the module.

    Attributes:
        section: top-level key holding the state dict (``"model"``, ``"state_dict"``); ``None`` if
            the file is the state dict itself.
        strip_prefix: a prefix every key carries (``"module."``, ``"CARZero."``); keys without it
            are an error.
        drops: keys dropped before matching (only if present and not in the module).
    """

    section: str | None = None
    strip_prefix: str = ""
    drops: tuple[DeclaredDrop, ...] = field(default_factory=tuple)


class CheckpointMismatchError(RuntimeError):
    """The file's tensors do not match the module's state dict exactly."""

    def __init__(self, file: Path | str, target: str, missing, unexpected, reshaped, hint: str = "") -> None:
        self.missing, self.unexpected, self.reshaped = sorted(missing), sorted(unexpected), sorted(reshaped)
        lines = [f"checkpoint {file} does not match {target}:"]
        if self.missing:
            lines.append(f"  missing in the file ({len(self.missing)}): {group_keys(self.missing)}")
        if self.unexpected:
            lines.append(f"  unexpected in the file ({len(self.unexpected)}): {group_keys(self.unexpected)}")
        for key, found, expected in reshaped:
            lines.append(f"  shape of {key}: file {list(found)} vs model {list(expected)}")
        if hint:
            lines.append(f"  {hint}")
        lines.append(
            "  Check that the file is the authors' release for this model and variant "
            "(`python -m xbench.inspect_checkpoint FILE` lists what it holds)."
        )
        super().__init__("\n".join(lines))


def group_keys(keys: list[str], depth: int = 2, shown: int = 6) -> str:
    """``a.b.{c, d}; e.f.{g}``: keys grouped by their first ``depth`` dotted parts (after a
    ``section/`` in front, as in ``image_encoder/resnet.layer1.{...}``)."""
    groups: dict[str, list[str]] = defaultdict(list)
    for key in keys:
        section, slash, dotted = key.rpartition("/")
        parts = dotted.split(".")
        groups[section + slash + ".".join(parts[:depth])].append(".".join(parts[depth:]))
    rendered = []
    for prefix, rests in groups.items():
        rests = [r for r in rests if r]
        if not rests:
            rendered.append(prefix)
            continue
        more = f", … {len(rests) - shown} more" if len(rests) > shown else ""
        rendered.append(f"{prefix}.{{{', '.join(rests[:shown])}{more}}}")
    return "; ".join(rendered)


def extract_state_dict(loaded: Any, layout: CheckpointLayout, file: Path | str) -> dict[str, Tensor]:
    """The layout's state dict out of a loaded file, prefix stripped."""
    state = loaded
    if layout.section is not None:
        if not isinstance(loaded, Mapping) or layout.section not in loaded:
            found = list(loaded) if isinstance(loaded, Mapping) else type(loaded).__name__
            raise ValueError(f"checkpoint {file}: expected a top-level entry {layout.section!r}; found {found}")
        state = loaded[layout.section]
    if not isinstance(state, Mapping):
        raise ValueError(f"checkpoint {file}: the weights are a {type(state).__name__}, not a state dict")
    if layout.strip_prefix:
        bad = [key for key in state if not key.startswith(layout.strip_prefix)]
        if bad:
            raise ValueError(
                f"checkpoint {file}: keys without the expected prefix {layout.strip_prefix!r}: {group_keys(bad)}"
            )
        state = {key[len(layout.strip_prefix):]: value for key, value in state.items()}
    non_tensors = [key for key, value in state.items() if not isinstance(value, Tensor)]
    if non_tensors:
        raise ValueError(f"checkpoint {file}: entries that are not tensors: {group_keys(non_tensors)}")
    return dict(state)


def load_state_dict_strict(
    module: nn.Module, state: dict[str, Tensor], *, file: Path | str, drops: tuple[DeclaredDrop, ...] = (),
    hint: str = "",
) -> None:
    """Apply declared drops, require an exact key and shape match, then load (``hint``: the fix a
    mismatch names, for the model's own options)."""
    expected = module.state_dict()
    state = dict(state)
    failed = []
    for drop in drops:
        if drop.key in state and drop.key not in expected:
            tensor = state.pop(drop.key)
            if drop.check is not None and not drop.check(tensor):
                failed.append(f"declared drop {drop.key} ({drop.reason}) failed its check: expected "
                              f"{drop.check.__doc__}, the file's tensor has shape {list(tensor.shape)}")
    missing = expected.keys() - state.keys()
    unexpected = state.keys() - expected.keys()
    reshaped = [
        (key, tuple(state[key].shape), tuple(expected[key].shape))
        for key in expected.keys() & state.keys()
        if state[key].shape != expected[key].shape
    ]
    if failed:  # said first, with every other difference of the file after it
        others = [str(CheckpointMismatchError(file, type(module).__name__, missing, unexpected, reshaped, hint))] if (
            missing or unexpected or reshaped) else []
        raise ValueError("\n".join([f"checkpoint {file}: " + "; ".join(failed), *others]))
    if missing or unexpected or reshaped:
        raise CheckpointMismatchError(file, type(module).__name__, missing, unexpected, reshaped, hint)
    check_aliases(module, state, file=file)
    module.load_state_dict(state, strict=True)


def check_aliases(module: nn.Module, state: Mapping[str, Tensor], *, file: Path | str) -> None:
    """Keys naming one tensor of ``module`` (e.g. KAD's ResNet under ``resnet.*`` and
    ``res_features.N.*``) must hold equal values in ``state``: loading would keep only the last."""
    names: dict[int, list[str]] = defaultdict(list)
    for key, value in module.state_dict(keep_vars=True).items():
        names[id(value)].append(key)
    differing = [
        keys for keys in names.values()
        if len(keys) > 1 and not all(torch.equal(state[keys[0]], state[key]) for key in keys[1:])
    ]
    if differing:
        shown = "; ".join(" vs ".join(keys) for keys in differing[:6])
        raise ValueError(
            f"checkpoint {file}: {len(differing)} tensors that the model holds once under several names "
            f"have different values in the file: {shown}. The file was not saved from this architecture."
        )


def load_state_dicts(
    loaded: Any, parts: list[tuple[nn.Module, CheckpointLayout]], *, file: Path | str, hint: str = ""
) -> None:
    """Load several state dicts of one loaded file (one layout per module, each naming its section).

    Every part is matched strictly; the differences of all parts are reported together in one
    [`CheckpointMismatchError`][xbench.models.checkpoints.CheckpointMismatchError], keys written
    ``<section>/<key>`` as in the key manifests.
    """
    missing: list[str] = []
    unexpected: list[str] = []
    reshaped: list[tuple[str, tuple, tuple]] = []
    for module, layout in parts:
        state = extract_state_dict(loaded, layout, file)
        try:
            load_state_dict_strict(module, state, file=file, drops=layout.drops)
        except CheckpointMismatchError as error:
            tag = f"{layout.section}/" if layout.section is not None else ""
            missing += [tag + key for key in error.missing]
            unexpected += [tag + key for key in error.unexpected]
            reshaped += [(tag + key, found, expected) for key, found, expected in error.reshaped]
    if missing or unexpected or reshaped:
        target = ", ".join(f"{type(module).__name__} ({layout.section})" for module, layout in parts)
        raise CheckpointMismatchError(file, target, missing, unexpected, reshaped, hint=hint)


def load_checkpoint(module: nn.Module, file: str | Path, layout: CheckpointLayout, hint: str = "") -> Any:
    """Load ``file`` into ``module`` per ``layout``; return the whole loaded file (for its metadata).
    ``hint``: the fix a mismatch names besides the file (the option that chose the architecture)."""
    loaded = safe_load(file)
    load_state_dict_strict(module, extract_state_dict(loaded, layout, file), file=file, drops=layout.drops,
                           hint=hint)
    return loaded


def manifest(state: Mapping[str, Tensor]) -> dict[str, list[int]]:
    """``{key: shape}`` in the format of the key manifests in ``specs/models``."""
    return {key: list(value.shape) for key, value in state.items()}


def first_present(folder: str | Path, names: tuple[str, ...], what: str) -> Path:
    """The first of ``names`` in ``folder`` (authors publish the same weights under several names,
    in order of preference); else an error naming the folder and every accepted name."""
    folder = Path(folder).expanduser()
    for name in names:
        if present(folder / name):
            return folder / name
    where = f"in {folder}" if folder.is_dir() else f"(folder {folder} not found)"
    raise FileNotFoundError(f"{what}: none of {', '.join(names)} found {where}. {missing_files_fix(folder, names[:1])}")


def read_hyper_parameters(loaded: Any, file: Path | str, expected: Mapping[str, Any]) -> None:
    """Compare the training config a Lightning file keeps under ``hyper_parameters`` with the values
    a model hard-codes (``expected``: dotted keys, as ``model.text.last_n_layers``).

    A different value is an error (the file is another variant of the model); a config that cannot
    be read, or lacks some keys, is a warning, since the weights alone already matched exactly.
    """
    try:
        config = omegaconf_values(loaded.get("hyper_parameters"))
        if not isinstance(config, Mapping):
            raise ValueError("it holds no configuration")
    except ValueError as error:
        warnings.warn(f"{file}: hyper_parameters not readable ({error}); the settings are not cross-checked",
                      stacklevel=3)
        return
    absent = object()
    missing, differing = [], []
    for dotted, value_expected in expected.items():
        value: Any = config
        for part in dotted.split("."):
            value = value.get(part, absent) if isinstance(value, Mapping) else absent
        if value is absent:
            missing.append(dotted)
        elif value != value_expected or type(value) is not type(value_expected):
            differing.append(f"{dotted} = {value!r}, expected {value_expected!r}")
    if differing:
        raise ValueError(f"checkpoint {file} was trained with other settings: " + "; ".join(differing))
    if missing:
        warnings.warn(f"{file}: hyper_parameters lack {', '.join(missing)}; those are not cross-checked", stacklevel=3)
