"""List what a checkpoint file holds: ``python -m xbench.inspect_checkpoint FILE [--json OUT]``.

Every tensor's name, shape and dtype; each state dict's common key prefix (a DDP ``module.``);
and the entries that are not tensors (optimizer, config, epoch). The file is read with
[`xbench.models.checkpoints.safe_load`][xbench.models.checkpoints.safe_load], so nothing in it runs;
an object of a class torch does not allow is shown as ``<inert ClassName>``.

Names follow the key manifests (``xbench/models/manifests/*.keys.json``): a tensor's path of
string keys joined by ``/``, e.g. ``image_encoder/resnet.conv1.weight``; a file that is itself a
state dict gives the bare keys. ``--json OUT`` writes ``{"<file name>": {"<name>": [shape]}}``,
the manifests' format, ready to compare with the layout a model expects.
"""

from __future__ import annotations

import argparse
import json
import os
from collections.abc import Mapping
from pathlib import Path
from typing import Any

from torch import Tensor

from xbench.cli import run
from xbench.models.checkpoints import manifest, safe_load


def tensor_entries(loaded: Any) -> tuple[dict[str, Tensor], dict[str, Any]]:
    """``(tensors, others)``: every tensor reachable through string keys, by its ``/``-joined path,
    and every other leaf (including containers with non-string keys, such as optimizer state)."""
    tensors: dict[str, Tensor] = {}
    others: dict[str, Any] = {}

    def walk(value: Any, path: list[str]) -> None:
        name = "/".join(path)
        if isinstance(value, Tensor):
            tensors[name] = value
        elif isinstance(value, Mapping) and value and all(isinstance(key, str) for key in value):
            for key, item in value.items():
                walk(item, [*path, key])
        else:
            others[name or "(file)"] = value

    walk(loaded, [])
    return tensors, others


def common_prefix(keys: list[str]) -> str:
    """The longest prefix, ending in ``.``, that every key carries ("" if none)."""
    if not keys:
        return ""
    shared = os.path.commonprefix(keys)
    return shared[: shared.rfind(".") + 1]


def describe(value: Any) -> str:
    """One line for a non-tensor entry."""
    if isinstance(value, Mapping):
        tensors = sum(1 for _ in _tensors_in(value))
        held = f", holding {tensors} tensors" if tensors else ""
        return f"{type(value).__name__} with {len(value)} entries{held}"
    if isinstance(value, (list, tuple)):
        return f"{type(value).__name__} of {len(value)}"
    text = repr(value)
    return text if len(text) <= 80 else text[:77] + "..."


def _tensors_in(value: Any):
    if isinstance(value, Tensor):
        yield value
    elif isinstance(value, Mapping):
        for item in value.values():
            yield from _tensors_in(item)
    elif isinstance(value, (list, tuple)):
        for item in value:
            yield from _tensors_in(item)


def sections(tensors: dict[str, Tensor]) -> dict[str, list[str]]:
    """Tensor names grouped by the path of the state dict that holds them ("" = top level)."""
    grouped: dict[str, list[str]] = {}
    for name in tensors:
        section, _, key = name.rpartition("/")
        grouped.setdefault(section, []).append(key)
    return grouped


def report(file: Path, tensors: dict[str, Tensor], others: dict[str, Any]) -> str:
    grouped = sections(tensors)
    lines = [f"{file}: {len(tensors)} tensors in {len(grouped)} state dicts, {len(others)} other entries"]
    for section, keys in grouped.items():
        prefix = common_prefix(keys)
        lines.append(f"[{section or 'top level'}] {len(keys)} tensors; common prefix: {prefix or '(none)'}")
    lines.append("tensors (name, shape, dtype):")
    for name, tensor in tensors.items():
        lines.append(f"  {name} {list(tensor.shape)} {str(tensor.dtype).removeprefix('torch.')}")
    if others:
        lines.append("other entries:")
        lines.extend(f"  {name}: {describe(value)}" for name, value in others.items())
    return "\n".join(lines)


def main(args: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(prog="python -m xbench.inspect_checkpoint", description=__doc__,
                                     formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("file", type=Path, help="the checkpoint (.pt, .pth, .bin, .ckpt, .safetensors)")
    parser.add_argument("--json", type=Path, metavar="OUT", help="also write the tensors as a key manifest")
    options = parser.parse_args(args)
    tensors, others = tensor_entries(safe_load(options.file))
    print(report(options.file, tensors, others))
    if options.json is not None:
        options.json.write_text(json.dumps({options.file.name: manifest(tensors)}, indent=1) + "\n")
        print(f"manifest written to {options.json}")


def cli() -> None:
    """The command line, ``xbench-inspect-checkpoint`` or ``python -m xbench.inspect_checkpoint``."""
    run(main, "xbench-inspect-checkpoint")


if __name__ == "__main__":
    cli()
