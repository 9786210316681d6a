"""Safe, strict checkpoint loading and local text towers (shared by every model)."""

import argparse
from pathlib import Path

import pytest
import torch
from torch import nn
from transformers.utils import logging as hf_logging

from xbench.models.checkpoints import (
    CheckpointLayout,
    CheckpointMismatchError,
    DeclaredDrop,
    InertObject,
    is_arange,
    load_checkpoint,
    safe_load,
)
from xbench.models.text import load_pretrained_bert, load_tokenizer

MARKER = Path("/tmp/xbench-test-unpickle-marker")


def _explode(payload):  # what a malicious pickle would call on plain torch.load(weights_only=False)
    MARKER.write_text(payload)
    return payload


class Explosive:
    def __reduce__(self):
        return (_explode, ("ran code from a pickle",))


class Tiny(nn.Module):
    def __init__(self, width=4):
        super().__init__()
        self.linear = nn.Linear(3, width)
        self.norm = nn.BatchNorm1d(width)


def save_authors_layout(path, module, **extra):
    optimizer = torch.optim.SGD(module.parameters(), lr=0.1, momentum=0.9)
    state = {f"module.{k}": v for k, v in module.state_dict().items()}
    torch.save({"model": state, "optimizer": optimizer.state_dict(), "config": argparse.Namespace(lr=0.1),
                "epoch": 3, "hook": Explosive(), **extra}, path)


LAYOUT = CheckpointLayout(section="model", strip_prefix="module.")


def test_loads_authors_layout_without_running_code(tmp_path):
    MARKER.unlink(missing_ok=True)
    source = Tiny()
    save_authors_layout(tmp_path / "ckpt.pth", source)
    target = Tiny()
    loaded = load_checkpoint(target, tmp_path / "ckpt.pth", LAYOUT)
    for key, value in source.state_dict().items():
        assert torch.equal(target.state_dict()[key], value)
    assert not MARKER.exists(), "loading executed code from the pickle"
    assert isinstance(loaded["hook"], InertObject) and loaded["hook"].qualified_name.endswith("_explode")
    assert loaded["hook"].args == ("ran code from a pickle",)
    assert isinstance(loaded["config"], InertObject) and loaded["config"].qualified_name == "argparse.Namespace"
    assert loaded["epoch"] == 3


@pytest.mark.parametrize(
    "edit, pattern",
    [
        (lambda s: s.pop("module.linear.bias"), r"missing in the file \(1\): linear\.bias"),
        (lambda s: s.update({"module.extra.weight": torch.zeros(1)}), r"unexpected in the file \(1\): extra\.weight"),
        (lambda s: s.update({"module.linear.weight": torch.zeros(5, 3)}), r"shape of linear\.weight: file \[5, 3\] vs model \[4, 3\]"),
    ],
    ids=["missing", "extra", "reshaped"],
)
def test_mismatches_name_the_key(tmp_path, edit, pattern):
    state = {f"module.{k}": v for k, v in Tiny().state_dict().items()}
    edit(state)
    torch.save({"model": state}, tmp_path / "bad.pth")
    with pytest.raises(CheckpointMismatchError, match=pattern):
        load_checkpoint(Tiny(), tmp_path / "bad.pth", LAYOUT)


def test_prefix_and_section_are_checked(tmp_path):
    torch.save({"model": Tiny().state_dict()}, tmp_path / "noprefix.pth")
    with pytest.raises(ValueError, match="expected prefix 'module.'"):
        load_checkpoint(Tiny(), tmp_path / "noprefix.pth", LAYOUT)
    torch.save({"weights": {}}, tmp_path / "nosection.pth")
    with pytest.raises(ValueError, match="top-level entry 'model'"):
        load_checkpoint(Tiny(), tmp_path / "nosection.pth", LAYOUT)


def test_declared_drop_is_checked(tmp_path):
    layout = CheckpointLayout(drops=(DeclaredDrop("position_ids", "old transformers buffer", is_arange),))
    good = {**Tiny().state_dict(), "position_ids": torch.arange(5).unsqueeze(0)}
    torch.save(good, tmp_path / "good.pth")
    load_checkpoint(Tiny(), tmp_path / "good.pth", layout)
    bad = {**Tiny().state_dict(), "position_ids": torch.ones(1, 5, dtype=torch.long)}
    torch.save(bad, tmp_path / "bad.pth")
    with pytest.raises(ValueError, match="declared drop position_ids"):
        load_checkpoint(Tiny(), tmp_path / "bad.pth", layout)


def test_safetensors_and_missing_file(tmp_path):
    from safetensors.torch import save_file

    save_file(Tiny().state_dict(), tmp_path / "w.safetensors")
    assert set(safe_load(tmp_path / "w.safetensors")) == set(Tiny().state_dict())
    with pytest.raises(FileNotFoundError, match="nothing.pth"):
        safe_load(tmp_path / "nothing.pth")


def write_tiny_bert(folder, extra_keys=()):
    from transformers import BertConfig, BertModel

    folder.mkdir(parents=True, exist_ok=True)
    vocab = ["[PAD]", "[UNK]", "[CLS]", "[SEP]", "[MASK]", "there", "is", "effusion", "##s"]
    (folder / "vocab.txt").write_text("\n".join(vocab) + "\n")
    config = BertConfig(vocab_size=len(vocab), hidden_size=8, num_hidden_layers=1, num_attention_heads=2,
                        intermediate_size=16, max_position_embeddings=32)
    model = BertModel(config)
    config.save_pretrained(folder)
    weights = {f"bert.{key}": value for key, value in model.state_dict().items()}  # as BertForPreTraining saves
    weights.update({key: torch.zeros(1) for key in extra_keys})
    torch.save(weights, folder / "pytorch_model.bin")
    return model


def test_local_bert_and_tokenizer(tmp_path, no_network):
    source = write_tiny_bert(tmp_path / "bert", extra_keys=("cls.predictions.bias",))
    verbosity = hf_logging.get_verbosity()
    loaded = load_pretrained_bert(tmp_path / "bert", "test BERT")
    assert hf_logging.get_verbosity() == verbosity  # its load report is silenced only while loading
    for key, value in source.state_dict().items():
        assert torch.equal(loaded.state_dict()[key], value)
    tokenizer = load_tokenizer(tmp_path / "bert", "test BERT")
    assert tokenizer("There is effusions")["input_ids"] == [2, 5, 6, 7, 8, 3]


def test_local_bert_rejects_foreign_weights(tmp_path, no_network):
    write_tiny_bert(tmp_path / "bert", extra_keys=("pooler.extra.weight",))
    with pytest.raises(ValueError, match="pooler.extra.weight"):
        load_pretrained_bert(tmp_path / "bert", "test BERT")
    with pytest.raises(FileNotFoundError, match="folder .*nowhere not found"):
        load_pretrained_bert(tmp_path / "nowhere", "test BERT")
    (tmp_path / "empty").mkdir()
    with pytest.raises(FileNotFoundError, match="config.json not found in"):
        load_pretrained_bert(tmp_path / "empty", "test BERT")
