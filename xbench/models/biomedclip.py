"""BiomedCLIP (ViT-B/16 + PubMedBERT, trained on PMC figure-caption pairs) through open_clip, offline.

The official ``open_clip_config.json`` is used unedited except that its text tower is pointed at
the checkpoint folder: the json names the hub repository of BiomedBERT, which open_clip would
ask the network for even when the weights are local. The folder therefore also holds BiomedBERT's
``config.json`` and the tokenizer's ``vocab.txt``; no BERT weights are read from it, they are
part of the BiomedCLIP checkpoint. Given as a hub id (``hf-hub:microsoft/BiomedCLIP-...``), the
snapshot lacks that ``config.json``: it is read from the cache's snapshot of the repository the
json names, as open_clip would fetch it. Recognition and maps follow `OpenClipDualEncoder`.
"""

from __future__ import annotations

from collections.abc import Callable
from pathlib import Path
from typing import ClassVar

import open_clip
from torch import Tensor, nn

from xbench.files import read_json
from xbench.models.base import LayerGroup
from xbench.models.checkpoints import CheckpointLayout, DeclaredDrop, is_arange, load_checkpoint
from xbench.models.hub import HUB_PREFIX, checkpoint_folder, snapshot_hub_id
from xbench.models.clip import PAIR_LOGIT, OpenClipDualEncoder
from xbench.models.explainers import CamTarget
from xbench.models.text import require_files


class BiomedCLIP(OpenClipDualEncoder):
    """BiomedCLIP (``microsoft/BiomedCLIP-PubMedBERT_256-vit_base_patch16_224``): 14x14 maps.

    Prompts default to BiomedCLIP's own prefix with CheXzero's negation
    (``"this is a photo of {}"`` / ``"this is a photo of no {}"``), tokenised to 256 tokens.
    """

    display_name = "BiomedCLIP"
    config_file: ClassVar[str] = "open_clip_config.json"
    layer_groups: ClassVar[tuple[LayerGroup, ...]] = (
        LayerGroup("projections", ("model.visual.head.*", "model.visual.trunk.norm.*", "model.text.proj.*"), text=True),
        LayerGroup("image tower", ("model.visual.*",), blocks="model.visual.trunk.blocks"),
        LayerGroup("text tower", ("model.text.*",), blocks="model.text.transformer.encoder.layer", text=True),
    )
    weights_file: ClassVar[str] = "open_clip_pytorch_model.bin"
    #: BiomedBERT's architecture file, which BiomedCLIP's hub repository does not hold.
    text_config_file: ClassVar[str] = "config.json"
    #: In a hub snapshot, what tells transformers the tokenizer's class in that file's place.
    tokenizer_config_file: ClassVar[str] = "tokenizer_config.json"
    #: Everything read from ``checkpoint_dir``: the CLIP config and weights, BiomedBERT's config, the vocabulary.
    files: ClassVar[tuple[str, ...]] = (config_file, weights_file, text_config_file, "vocab.txt")
    layout: ClassVar[CheckpointLayout] = CheckpointLayout(
        drops=(
            DeclaredDrop(
                "text.transformer.embeddings.position_ids",
                "a buffer transformers < 4.31 saved in the state dict; newer versions rebuild it",
                is_arange,
            ),
        )
    )
    #: The text tower the weights were trained with; open_clip's defaults (mean pooling) load the
    #: same tensors without complaint, so a config without these is refused.
    text_tower: ClassVar[dict[str, str]] = {"hf_pooler_type": "cls_last_hidden_state_pooler", "hf_proj_type": "mlp"}
    #: The tokens entering the last block's attention (after its first norm), class token first.
    cam_target: ClassVar[CamTarget] = CamTarget("model.visual.trunk.blocks.-1.norm1", PAIR_LOGIT, prefix_tokens=1)

    def __init__(
        self,
        checkpoint_dir: str = "checkpoints/biomedclip",
        pos_template: str = "this is a photo of {}",
        neg_template: str = "this is a photo of no {}",
        **kwargs,
    ) -> None:
        super().__init__(checkpoint_dir, pos_template, neg_template, **kwargs)

    def load_model(self) -> tuple[nn.Module, Callable[[list[str]], Tensor]]:
        from_hub = snapshot_hub_id(self.checkpoint_dir.resolve()) is not None
        needed = tuple(self.tokenizer_config_file if from_hub and name == self.text_config_file else name
                       for name in self.files)
        folder = require_files(self.checkpoint_dir, needed, "BiomedCLIP").resolve()
        config_path = folder / self.config_file
        try:
            model_cfg = read_json(config_path)["model_cfg"]
            text_cfg = model_cfg["text_cfg"]
        except (ValueError, KeyError, TypeError) as error:
            raise ValueError(
                f"BiomedCLIP: {config_path} is not an open_clip config with model_cfg.text_cfg ({error!r}); "
                "download the official file again"
            ) from error
        wrong = {key: text_cfg.get(key) for key, value in self.text_tower.items() if text_cfg.get(key) != value}
        if wrong:
            raise ValueError(
                f"BiomedCLIP: {config_path} sets {wrong}, expected {self.text_tower}. It is not the current official "
                "config (older copies used `proj`/`pooler_type`); download it again from the pinned revision"
            )
        text_folder = self.text_tower_folder(text_cfg, config_path) if from_hub else folder
        local_text = {**text_cfg, "hf_model_name": str(text_folder), "hf_tokenizer_name": str(folder),
                      "hf_model_pretrained": False}
        model = open_clip.CustomTextCLIP(**{**model_cfg, "text_cfg": local_text})
        load_checkpoint(model, folder / self.weights_file, self.layout)
        tokenizer = open_clip.get_tokenizer(f"local-dir:{folder}")
        if tokenizer.tokenizer.pad_token_id != model.text.config.pad_token_id:
            raise ValueError(
                f"BiomedCLIP: the vocabulary in {folder} pads with id {tokenizer.tokenizer.pad_token_id} but the text "
                f"tower masks id {model.text.config.pad_token_id} (config.json pad_token_id); use the official "
                "vocab.txt and BiomedBERT's config.json"
            )
        return model, tokenizer

    def text_tower_folder(self, text_cfg: dict, config_path: Path) -> Path:
        """The cache's snapshot of the repository ``text_cfg`` names for the text tower (its ``config.json``),
        for a BiomedCLIP snapshot, whose repository holds none."""
        repository = text_cfg.get("hf_model_name")
        if not isinstance(repository, str):
            raise ValueError(f"BiomedCLIP: {config_path} names no text tower repository (model_cfg.text_cfg."
                             "hf_model_name); download the official file again")
        folder = checkpoint_folder(HUB_PREFIX + repository,
                                   f"BiomedCLIP's text tower ({config_path.name}'s hf_model_name)")
        return require_files(folder, (self.text_config_file,), "BiomedCLIP's text tower")

    @property
    def input_size(self) -> int:
        return self.model.visual.trunk.patch_embed.img_size[0]

    @property
    def grid(self) -> tuple[int, int]:
        return tuple(self.model.visual.trunk.patch_embed.grid_size)

    @property
    def prefix_tokens(self) -> int:
        return self.model.visual.trunk.num_prefix_tokens

    def embed_image(self, x: Tensor) -> tuple[Tensor, Tensor]:
        visual = self.model.visual
        features = visual.trunk.forward_features(x)  # every token through the trunk's final norm
        pooled = visual.trunk.forward_head(features)
        return visual.head(pooled), visual.head(features[:, self.prefix_tokens:])
