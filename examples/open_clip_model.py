"""Worked example: your own model, an open_clip dual encoder with patch–text maps, outside XBench.

The class below is all XBench needs: its input transform as data (``preprocess``), the prompts
encoded once per run (``build``), and ``forward`` returning log-odds [B, C] and raw maps
[B, C, h, w]. XBench does the rest (upsampling, metrics, results, report). Two more lines
(``query_mode``, ``encode_phrases``) let it ground free-text report phrases (MS-CXR). Run it with
``examples/`` on the import path, so the YAML's ``class_path: open_clip_model.PatchTextCLIP`` is
found (or install your module)::

    python examples/open_clip_model.py --random-weights /tmp/tiny_clip.safetensors
    PYTHONPATH=examples python -m xbench.test --config examples/open_clip_model.yaml \\
      --config lightning_configs/data/phantom.yaml --model.weights /tmp/tiny_clip.safetensors

``arch`` is an open_clip architecture: a built-in name (``ViT-B-16``) or your own JSON config
(``examples/tiny_vit.json``, small enough to try the wiring with random weights).
"""

from __future__ import annotations

import argparse
import json
from pathlib import Path

import open_clip
import torch
import torch.nn.functional as F
from safetensors.torch import save_file
from torch import Tensor

from xbench.findings import finding_text
from xbench.geometry.preprocess import OPENAI_CLIP_MEAN, OPENAI_CLIP_STD, Preprocess
from xbench.models.base import XBenchModel
from xbench.models.checkpoints import CheckpointLayout, load_checkpoint
from xbench.models.saliency import patch_text_similarity


def build_open_clip(arch: str) -> tuple[open_clip.CLIP, int]:
    """The untrained open_clip model of ``arch`` (a built-in name or a JSON config file) and its text length."""
    config = json.loads(Path(arch).read_text()) if arch.endswith(".json") else open_clip.get_model_config(arch)
    if config is None:
        raise ValueError(f"{arch!r} is neither an open_clip architecture nor a .json model config")
    return open_clip.CLIP(**config), config["text_cfg"].get("context_length", 77)


class PatchTextCLIP(XBenchModel):
    """Score: the 2-way softmax of "{finding}" against "no {finding}"; map: patch–prompt cosine.

    Args:
        arch: open_clip architecture name or JSON config. weights: its state dict, a local ``.safetensors``.
    """

    name = "patch_text_clip"
    #: It encodes free text, so a report phrase is grounded as written (phrase grounding, MS-CXR).
    query_mode = "phrase"

    def __init__(self, arch: str, weights: str, **kwargs) -> None:
        super().__init__(**kwargs)
        if not Path(weights).is_file():
            raise FileNotFoundError(
                f"{type(self).__name__}: no weights file at {weights}: give a .safetensors state dict of {arch} "
                "with --model.weights PATH (`python examples/open_clip_model.py --random-weights PATH` writes "
                "random ones to try the wiring)"
            )
        self.clip, self.context_length = build_open_clip(arch)
        # strict, and a mismatch names the file, the keys by group and the fix
        load_checkpoint(self.clip, weights, CheckpointLayout(), hint=(
            f"Are these weights of --model.arch {arch}? Give the architecture they were saved from, or "
            "weights saved from this one."))
        self.clip.eval().requires_grad_(False)
        self.clip.visual.output_tokens = True
        side = self.clip.visual.image_size[0]
        self.preprocess = Preprocess(side, "shorter_side", interpolation="bicubic", mean=OPENAI_CLIP_MEAN,
                                     std=OPENAI_CLIP_STD)

    @torch.no_grad()
    def embed_text(self, prompts: list[str]) -> Tensor:
        tokens = open_clip.tokenize(prompts, context_length=self.context_length).to(self.clip.logit_scale.device)
        return F.normalize(self.clip.encode_text(tokens), dim=-1)

    def encode_phrases(self, texts: list[str]) -> dict[str, Tensor]:
        """What ``forward`` reads, one row per text: a finding's name (``build``) or a report phrase."""
        return {"positive": self.embed_text(texts), "negative": self.embed_text([f"no {text}" for text in texts])}

    def build(self, classes: list[str]) -> None:
        for name, value in self.encode_phrases([finding_text(key) for key in classes]).items():
            self.register_buffer(name, value, persistent=False)

    def forward(self, x: Tensor) -> tuple[Tensor, Tensor]:
        pooled, tokens = self.clip.visual(x)
        image = F.normalize(pooled, dim=-1)
        logits = self.clip.logit_scale.exp() * (image @ self.positive.T - image @ self.negative.T)
        maps = patch_text_similarity(tokens @ self.clip.visual.proj, self.positive, tuple(self.clip.visual.grid_size))
        return logits, maps


def write_random_weights(path: Path, arch: str = str(Path(__file__).with_name("tiny_vit.json"))) -> None:
    """Seeded random weights of ``arch``, to try the wiring before you have trained ones."""
    torch.manual_seed(0)
    save_file(build_open_clip(arch)[0].state_dict(), path)


if __name__ == "__main__":
    parser = argparse.ArgumentParser(description="Write random weights of an open_clip architecture, to try the wiring.")
    parser.add_argument("--random-weights", type=Path, required=True, help="the .safetensors file to write")
    args = parser.parse_args()
    write_random_weights(args.random_weights)
    print(f"wrote {args.random_weights}")
