"""``python -m xbench.inspect_checkpoint``: what a user's checkpoint holds, read without running it."""

import argparse
import json
import runpy
import sys
from pathlib import Path

import pytest
import torch

from xbench.inspect_checkpoint import main

MARKER = Path("/tmp/xbench-test-inspect-unpickle-marker")


def _explode(payload):
    MARKER.write_text(payload)
    return payload


class Explosive:
    def __reduce__(self):
        return (_explode, ("ran code from a pickle",))


WRITTEN = {  # name in the listing -> (shape, dtype)
    "image_encoder/module.vit.embeddings.cls_token": ([1, 1, 8], torch.float32),
    "image_encoder/module.vit.layer.0.weight": ([8, 8], torch.float16),
    "image_encoder/module.head.bias": ([8], torch.float32),
    "text_encoder/bert_model.embeddings.position_ids": ([1, 512], torch.int64),
    "text_encoder/logit_scale": ([], torch.float32),
    "model/decoder.norm.weight": ([768], torch.bfloat16),
}


def write_checkpoint(path: Path) -> None:
    saved: dict = {}
    for name, (shape, dtype) in WRITTEN.items():
        section, key = name.split("/", 1)
        saved.setdefault(section, {})[key] = torch.zeros(shape, dtype=dtype)
    parameter = torch.nn.Parameter(torch.ones(2))
    optimizer = torch.optim.AdamW([parameter])
    parameter.sum().backward()
    optimizer.step()
    saved.update(optimizer=optimizer.state_dict(), config={"img_res": 224}, epoch=7,
                 args=argparse.Namespace(lr=0.1), hook=Explosive())
    torch.save(saved, path)


def test_lists_every_tensor_written_and_nothing_else(tmp_path, capsys):
    MARKER.unlink(missing_ok=True)
    write_checkpoint(tmp_path / "best_valid.pt")
    main([str(tmp_path / "best_valid.pt"), "--json", str(tmp_path / "layout.json")])
    out = capsys.readouterr().out
    assert not MARKER.exists(), "inspecting executed code from the pickle"

    lines = out.splitlines()
    listed = {}
    for line in lines[lines.index("tensors (name, shape, dtype):") + 1: lines.index("other entries:")]:
        name, rest = line.strip().split(" ", 1)
        shape, dtype = rest.rsplit(" ", 1)
        listed[name] = (json.loads(shape), dtype)
    assert listed == {name: (shape, str(dtype).removeprefix("torch.")) for name, (shape, dtype) in WRITTEN.items()}

    assert json.loads((tmp_path / "layout.json").read_text()) == {
        "best_valid.pt": {name: shape for name, (shape, _) in WRITTEN.items()}
    }
    assert "[image_encoder] 3 tensors; common prefix: module." in out
    assert "[text_encoder] 2 tensors; common prefix: (none)" in out
    assert "[model] 1 tensors; common prefix: decoder.norm." in out
    others = lines[lines.index("other entries:") + 1:]
    assert "  optimizer/state: dict with 1 entries, holding 3 tensors" in others
    assert "  optimizer/param_groups: list of 1" in others
    assert "  config/img_res: 224" in others and "  epoch: 7" in others
    assert "  args: <inert argparse.Namespace>" in others
    assert any(line.startswith("  hook: <inert ") and "_explode" in line for line in others)


def test_a_bare_state_dict_runs_as_a_module(tmp_path, monkeypatch, capsys):
    """``python -m xbench.inspect_checkpoint``: the module run as ``-m`` runs it (its ``__main__``
    block), in this process, as its exit status and output are the same in a process of its own."""
    torch.save({"conv.weight": torch.zeros(4, 3, 2, 2), "conv.bias": torch.zeros(4)}, tmp_path / "w.pth")
    monkeypatch.setattr(sys, "argv", ["xbench-inspect-checkpoint", str(tmp_path / "w.pth")])
    monkeypatch.delitem(sys.modules, "xbench.inspect_checkpoint")  # run afresh, as -m does
    with pytest.raises(SystemExit) as exited:
        runpy.run_module("xbench.inspect_checkpoint", run_name="__main__", alter_sys=True)
    out = capsys.readouterr().out
    assert exited.value.code == 0, out
    assert "[top level] 2 tensors; common prefix: conv." in out
    assert "  conv.weight [4, 3, 2, 2] float32" in out.splitlines()
    assert "other entries:" not in out
