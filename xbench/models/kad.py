"""KAD (Zhang et al., Nature Communications 2023) and the query-decoder family it started.

A radiograph becomes a grid of image tokens; every prompt of the dataset becomes one Med-KEBERT
embedding; a 4-layer transformer decoder takes the prompts as queries over the image tokens and
ends in 2 logits per query (absent, present). The queries attend to each other, so a class's score
depends on which other prompts are decoded with it and in which order: all of a dataset's prompts
are decoded together, as one fixed query set. The map of a class is the last decoder layer's
cross-attention from its query to the image tokens, averaged over heads, on the token grid.

Checkpoint: ``best_valid.pt`` holds three state dicts -- ``image_encoder``, ``text_encoder`` and
``model`` (the decoder) -- plus optimizer, scheduler, config and epoch entries, which are read
without running code ([`xbench.models.checkpoints.safe_load`][xbench.models.checkpoints.safe_load]).
The authors' modules register some tensors under two names (the ResNet as ``resnet.*`` and
``res_features.N.*``; the decoder's final norm as ``decoder_norm.*`` and ``decoder.norm.*``); ours
do the same, so the key sets match exactly and both copies are checked equal. See
``xbench/models/manifests/kad.keys.json``.
"""

from __future__ import annotations

import logging
import math
import warnings
from abc import abstractmethod
from collections.abc import Mapping
from pathlib import Path
from typing import Any, ClassVar

import torch
import torch.nn.functional as F
from torch import Tensor, nn
from torchvision.models import resnet50

from xbench.files import present
from xbench.findings import finding_text
from xbench.models.base import LayerGroup, XBenchModel, resnet_stages
from xbench.models.checkpoints import CheckpointLayout, DeclaredDrop, is_arange, load_state_dicts, safe_load
from xbench.models.hub import checkpoint_folder
from xbench.models.decoder import PreNormQueryLayer
from xbench.models.explainers import NATIVE, CamTarget
from xbench.models.gpu import ChannelsLast
from xbench.geometry.preprocess import Preprocess
from xbench.models.text import bert_from_config, load_tokenizer

log = logging.getLogger(__name__)

# -- prompts -----------------------------------------------------------------------------------

#: The authors' ChestX-ray14 query set (``A3_CLIP/test_chestxray14.py``), in their order, as
#: (class key, prompt). Their CheXpert set uses the same strings for its five classes.
CHESTXRAY14_QUERIES: tuple[tuple[str, str], ...] = (
    ("atelectasis", "atelectasis"),
    ("cardiomegaly", "cardiomegaly"),
    ("pleural_effusion", "pleural effusion"),
    ("infiltration", "infiltration"),
    ("mass", "lung mass"),
    ("nodule", "lung nodule"),
    ("pneumonia", "pneumonia"),
    ("pneumothorax", "pneumothorax"),
    ("consolidation", "consolidation"),
    ("edema", "edema"),
    ("emphysema", "emphysema"),
    ("fibrosis", "fibrosis"),
    ("pleural_thickening", "pleural thicken"),
    ("hernia", "hernia"),
)

#: The authors' ChestX-Det10 query set (``A3_CLIP/plot_visualize_512.py``): the dataset's own
#: names in its order, lower-cased here as the authors' tokenizer (``do_lower_case=True``) does.
CHESTX_DET10_QUERIES: tuple[tuple[str, str], ...] = (
    ("atelectasis", "atelectasis"),
    ("calcification", "calcification"),
    ("consolidation", "consolidation"),
    ("pleural_effusion", "effusion"),
    ("emphysema", "emphysema"),
    ("fibrosis", "fibrosis"),
    ("fracture", "fracture"),
    ("mass", "mass"),
    ("nodule", "nodule"),
    ("pneumothorax", "pneumothorax"),
)

#: Datasets (``XBenchDataModule.name``) the authors evaluated, with the query set they decoded.
AUTHORS_QUERY_SETS: dict[str, tuple[tuple[str, str], ...]] = {
    "chestxray14": CHESTXRAY14_QUERIES,
    "chestx_det10": CHESTX_DET10_QUERIES,
}

#: Prompts for every other dataset (RSNA, SIIM, COVID-19, CheXlocalize, VinDr, a user's own).
#: This table is ours, not the authors' (they publish none for these datasets): each finding gets
#: the nearest term of KAD's own vocabularies -- the ChestX-ray14/CheXpert test lists (cxr14), the
#: training query vocabulary (train), the PadChest labels (padchest) -- or, where none fits, its
#: plain name (none). The classes are decoded together in the datamodule's order.
PROPOSED_PROMPTS: dict[str, str] = {
    "aortic_enlargement": "aortic enlargement",  # none
    "atelectasis": "atelectasis",  # cxr14
    "calcification": "calcification",  # train
    "cardiomegaly": "cardiomegaly",  # cxr14
    "clavicle_fracture": "clavicle fracture",  # padchest
    "consolidation": "consolidation",  # cxr14
    "covid19": "covid-19",  # none
    "edema": "edema",  # cxr14
    "emphysema": "emphysema",  # cxr14
    "enlarged_cardiomediastinum": "enlarged cardiomediastinum",  # train
    "enlarged_pa": "pulmonary artery enlargement",  # padchest
    "fibrosis": "fibrosis",  # cxr14
    "fracture": "fracture",  # train
    "hernia": "hernia",  # cxr14
    "infiltration": "infiltration",  # cxr14
    "interstitial_lung_disease": "interstitial pattern",  # padchest
    "lung_cavity": "cavitation",  # padchest
    "lung_cyst": "cyst",  # padchest
    "lung_lesion": "lesion",  # train
    "lung_opacity": "opacity",  # train
    "mass": "lung mass",  # cxr14
    "mediastinal_shift": "mediastinal shift",  # padchest
    "nodule": "lung nodule",  # cxr14
    "nodule_mass": "nodule",  # padchest ("mass" would be as close)
    "other_lesion": "lesion",  # train
    "pleural_effusion": "pleural effusion",  # cxr14
    "pleural_other": "pleural thicken",  # cxr14: CheXpert's "pleural other" is mostly thickening
    "pleural_thickening": "pleural thicken",  # cxr14
    "pneumonia": "pneumonia",  # cxr14
    "pneumothorax": "pneumothorax",  # cxr14
    "pulmonary_fibrosis": "pulmonary fibrosis",  # padchest
    "rib_fracture": "rib fracture",  # padchest
    "support_devices": "device",  # train
}


def query_set(classes: list[str], dataset: str | None) -> tuple[list[str], list[int]]:
    """The prompts decoded together for ``classes`` of ``dataset``, and each class's position in them.

    The authors' set for the dataset when it holds every class (decoded whole, in their order);
    otherwise the classes in the given order with `PROPOSED_PROMPTS`. A key with no prompt
    there gets [`xbench.findings.finding_text`][xbench.findings.finding_text], with a warning.
    """
    authors = dict(AUTHORS_QUERY_SETS.get(dataset, ()))
    if authors and set(classes) <= authors.keys():
        keys = list(authors)
        return list(authors.values()), [keys.index(key) for key in classes]
    if authors:
        warnings.warn(
            f"the authors' {dataset} query set has no prompt for {sorted(set(classes) - authors.keys())}: "
            "the classes are decoded as their own query set with XBench's proposed prompts",
            stacklevel=2,
        )
    unknown = [key for key in classes if key not in PROPOSED_PROMPTS]
    if unknown:
        warnings.warn(
            f"no prompt for {unknown}: using the finding's name; add it to PROPOSED_PROMPTS in xbench/models/kad.py",
            stacklevel=2,
        )
    prompts = [PROPOSED_PROMPTS.get(key) or finding_text(key) for key in classes]
    return prompts, list(range(len(classes)))


# -- modules, named as in the authors' files ----------------------------------------------------

EMBED_DIM = 768


class ResNetTokens(nn.Module):
    """KAD's image encoder (``ModelRes`` at 224, ``ModelRes512`` at 512 and 1024).

    A torchvision ResNet-50 cut after layer3 (1024 channels, stride 16) or layer4 (2048, stride
    32); every grid position goes through ``res_l1`` -> ReLU -> ``res_l2`` to 768. The whole ResNet
    is registered as ``resnet`` and its first children again as ``res_features``, as the authors
    do, so its weights carry two names (``fc``, and ``layer4`` at 224, are saved but unused).
    """

    def __init__(self, through_layer4: bool) -> None:
        super().__init__()
        self.resnet = resnet50()
        self.res_features = nn.Sequential(*list(self.resnet.children())[: 8 if through_layer4 else 7])
        width = 2048 if through_layer4 else 1024
        self.res_l1 = nn.Linear(width, width)
        self.res_l2 = nn.Linear(width, EMBED_DIM)

    def forward(self, image: Tensor) -> tuple[Tensor, tuple[int, int]]:
        """[B, 3, S, S] -> tokens [B, h*w, 768] in row-major grid order, and (h, w)."""
        features = self.res_features(image)
        tokens = features.flatten(2).transpose(1, 2)
        return self.res_l2(F.relu(self.res_l1(tokens))), tuple(features.shape[-2:])


class MedKEBERT(nn.Module):
    """KAD's text encoder (``CLP_clinical``): BERT pooler output -> ``mlp_embed``, not normalised."""

    def __init__(self, bert_model: nn.Module) -> None:
        super().__init__()
        self.bert_model = bert_model
        self.mlp_embed = nn.Sequential(nn.Linear(EMBED_DIM, EMBED_DIM), nn.GELU(), nn.Linear(EMBED_DIM, EMBED_DIM))
        #: Temperature of the contrastive pre-training; saved in the file, unused here.
        self.logit_scale = nn.Parameter(torch.tensor(math.log(1 / 0.07)))

    def forward(self, input_ids: Tensor, attention_mask: Tensor) -> Tensor:
        pooled = self.bert_model(input_ids=input_ids, attention_mask=attention_mask).pooler_output
        return self.mlp_embed(pooled)


class QueryDecoder(nn.Module):
    """KAD's fusion module (``TQN_Model``): 4 pre-norm layers, 4 heads, no positional encodings.

    ``decoder_norm`` normalises both inputs and, registered again as ``decoder.norm``, the output.
    """

    def __init__(self, num_layers: int = 4) -> None:
        super().__init__()
        #: Saved in the file, unused at inference.
        self.logit_scale = nn.Parameter(torch.tensor(math.log(1 / 0.07)))
        self.decoder_norm = nn.LayerNorm(EMBED_DIM)
        self.decoder = nn.ModuleDict(
            {"layers": nn.ModuleList(PreNormQueryLayer(EMBED_DIM, 4, 1024) for _ in range(num_layers)),
             "norm": self.decoder_norm}
        )
        self.dropout_feas = nn.Dropout(0.1)
        self.mlp_head = nn.Sequential(nn.Linear(EMBED_DIM, 2))

    def forward(self, image_tokens: Tensor, queries: Tensor) -> tuple[Tensor, Tensor]:
        """image tokens [B, N, D], queries [Q, D] -> scores [B, Q, 2], last layer's attention [B, Q, N]."""
        batch = image_tokens.shape[0]
        image = self.decoder_norm(image_tokens.transpose(0, 1))
        x = self.decoder_norm(queries.unsqueeze(1).expand(-1, batch, -1))
        layers = self.decoder["layers"]
        for depth, layer in enumerate(layers):
            x, attention = layer(x, image, need_weights=depth == len(layers) - 1)
        x = self.decoder["norm"](x)
        return self.mlp_head(self.dropout_feas(x).transpose(0, 1)), attention


# -- the family and KAD ---------------------------------------------------------------------------

#: What a CAM explainer explains in the query-decoder family.
QUERY_LOGIT = "the query decoder's logit l1 - l0 of the class's prompt query"

#: Old transformers (< 4.31) saved BERT's ``position_ids`` buffer; newer ones neither save nor expect it.
POSITION_IDS_DROP = DeclaredDrop(
    "bert_model.embeddings.position_ids", "a buffer transformers < 4.31 saved; rebuilt by BertModel", is_arange
)


class QueryDecoderModel(XBenchModel):
    """The query-decoder family (KAD, DeViDe): image tokens, Med-KEBERT prompt queries, 2 logits
    per query (logit = l1 - l0), the last layer's head-averaged cross-attention as the map. In phrase
    grounding each report phrase is a query, decoded alone
    ([`phrase_maps`][xbench.models.base.XBenchModel.phrase_maps]).

    A subclass sets ``self.image_encoder`` (returning tokens and their grid) and ``preprocess``
    (`authors_transform` at its input side), and names its checkpoint file. ``checkpoint_dir`` holds
    the file and ``Med-KEBERT/`` (the tokenizer files and ``config.json`` of ``xmcmic/Med-KEBERT``;
    the BERT weights come from the checkpoint's ``text_encoder`` section).
    """

    #: Module attribute -> where its state dict sits in the checkpoint file.
    CHECKPOINT_SECTIONS: ClassVar[dict[str, CheckpointLayout]] = {
        "image_encoder": CheckpointLayout(section="image_encoder"),
        "text_encoder": CheckpointLayout(section="text_encoder", drops=(POSITION_IDS_DROP,)),
        "query_decoder": CheckpointLayout(section="model"),
    }
    query_mode = "phrase"
    #: The groups every query-decoder model shares, from the output down; a subclass puts its image
    #: tower's between them (`decoder_groups`).
    HEAD_GROUPS: ClassVar[tuple[LayerGroup, ...]] = (
        LayerGroup("classifier head", ("query_decoder.mlp_head.*",)),
        LayerGroup("query decoder", ("query_decoder.*",), blocks="query_decoder.decoder.layers"),
        LayerGroup("text projection", ("text_encoder.mlp_embed.*",), text=True),
    )
    TEXT_GROUPS: ClassVar[tuple[LayerGroup, ...]] = (
        LayerGroup("text tower", ("text_encoder.*",), blocks="text_encoder.bert_model.encoder.layer", text=True),
    )
    TEXT_FOLDER: ClassVar[str] = "Med-KEBERT"
    #: The authors' tokenizer call: special tokens added, padded (and cut) to 256 tokens.
    MAX_TOKENS: ClassVar[int] = 256
    #: Appended to a checkpoint mismatch error.
    MISMATCH_HINT: ClassVar[str] = ""

    image_encoder: nn.Module

    @staticmethod
    def authors_transform(size: int) -> Preprocess:
        """KAD's test transform: PIL ``Resize([size, size])`` bicubic of the 8-bit image (squashed),
        ToTensor, ImageNet's mean/std; maps resized bilinearly (their ``cv2.resize``)."""
        return Preprocess(size, "squash", interpolation="bicubic", library="pil", map_upsample="bilinear")

    def __init__(self, checkpoint_dir: str, **kwargs) -> None:
        super().__init__(**kwargs)
        self.checkpoint_dir = checkpoint_folder(checkpoint_dir)
        self.query_decoder = QueryDecoder()
        #: The prompts decoded together, in order, and each class's position among them.
        self.prompts: list[str] = []
        self.weights_loaded = False
        self.register_buffer("queries", torch.zeros(0, EMBED_DIM), persistent=False)
        self.register_buffer("query_index", torch.zeros(0, dtype=torch.long), persistent=False)

    @abstractmethod
    def checkpoint_file(self) -> Path:
        """The checkpoint file under ``checkpoint_dir``."""

    def check_file(self, loaded: Any, file: Path) -> None:
        """A subclass's checks of the loaded file before the strict key match."""

    def build_text_tower(self) -> None:
        """Med-KEBERT's tokenizer, and ``self.text_encoder`` shaped by its ``config.json`` (weights not loaded)."""
        folder = self.checkpoint_dir / self.TEXT_FOLDER
        what = f"{type(self).__name__} text tower (Med-KEBERT)"
        self.tokenizer = load_tokenizer(folder, what)
        self.text_encoder = MedKEBERT(bert_from_config(folder, what))

    def checkpoint_parts(self) -> list[tuple[nn.Module, CheckpointLayout]]:
        return [(getattr(self, attribute), layout) for attribute, layout in self.CHECKPOINT_SECTIONS.items()]

    def load_weights(self) -> None:
        """Build the text tower and fill every tower from the checkpoint file, strictly."""
        self.build_text_tower()
        file = self.checkpoint_file()
        if not present(file):
            raise FileNotFoundError(
                f"{type(self).__name__}: checkpoint {file} not found. Place the authors' file there "
                "(see checkpoints/README.md) or set --model.checkpoint_dir."
            )
        loaded = safe_load(file)
        self.check_file(loaded, file)
        load_state_dicts(loaded, self.checkpoint_parts(), file=file, hint=self.MISMATCH_HINT)
        self.weights_loaded = True

    def encode_queries(self, classes: list[str]) -> None:
        """Embed the query set of ``classes`` (`query_set`) once; every batch reuses it."""
        self.prompts, index = query_set(classes, self.dataset_name)  # the authors' set where they have one
        log.info("%s decodes %d queries: %s", type(self).__name__, len(self.prompts), self.prompts)
        self.queries = self.embed_prompts(self.prompts)
        self.query_index = torch.tensor(index, device=self.queries.device)

    def embed_prompts(self, prompts: list[str]) -> Tensor:
        """Med-KEBERT queries [N, D] of ``prompts`` (the authors' tokenizer call), on the model's device."""
        tokens = self.tokenizer(
            prompts, padding="max_length", max_length=self.MAX_TOKENS, truncation=True, return_tensors="pt"
        ).to(self.queries.device)
        self.text_encoder.eval()
        with torch.no_grad():
            return self.text_encoder(tokens["input_ids"], tokens["attention_mask"])

    def encode_phrases(self, phrases: list[str]) -> dict[str, Tensor]:
        """Each phrase as a Med-KEBERT query, as written;
        [`phrase_maps`][xbench.models.base.XBenchModel.phrase_maps] decodes each on its own."""
        return {"queries": self.embed_prompts(phrases)}

    def build(self, classes: list[str]) -> None:
        """Load the checkpoint (once per model) and embed the query set of ``classes``."""
        if not self.weights_loaded:
            self.load_weights()
        self.encode_queries(classes)

    def decode(self, tokens: Tensor, grid: tuple[int, int], queries: Tensor) -> tuple[Tensor, Tensor]:
        """Image tokens [B, N, D] and one query set [Q, D], decoded together -> logits [B, Q], maps [B, Q, h, w]."""
        scores, attention = self.query_decoder(tokens, queries.to(tokens.dtype))
        return scores[..., 1] - scores[..., 0], attention.unflatten(-1, grid)

    def forward(self, pixels: Tensor) -> tuple[Tensor, Tensor]:
        if not self.prompts:
            raise RuntimeError(f"{type(self).__name__}.build(classes) has not run (trainer.test calls it in setup)")
        logits, maps = self.decode(*self.image_encoder(pixels), self.queries)
        return logits[:, self.query_index], maps[:, self.query_index]

    def phrase_outputs(self, model_input: Tensor, rows: dict[str, Tensor]) -> tuple[Tensor, Tensor]:
        """Scores [B, T] and maps [B, T, h, w]: each phrase decoded as a query set of its own, so that
        its outputs do not depend on the other phrases of the batch (queries attend to each other);
        for the native maps the image encoder runs once, a CAM explainer explains each phrase's own
        decoding."""
        if self.explainer != NATIVE:
            alone = torch.zeros(1, dtype=torch.long, device=model_input.device)
            outputs = [super(QueryDecoderModel, self).phrase_outputs(model_input, {"queries": query[None],
                                                                                 "query_index": alone})
                       for query in rows["queries"]]
        else:
            tokens, grid = self.image_encoder(model_input)
            outputs = [self.decode(tokens, grid, query[None]) for query in rows["queries"]]
        return tuple(torch.cat(part, dim=1) for part in zip(*outputs))


class KAD(ChannelsLast, QueryDecoderModel):
    """KAD at one of its three released resolutions.

    Args:
        checkpoint_dir: folder with ``KAD_<variant>/best_valid.pt`` and ``Med-KEBERT/``
            (``checkpoints/README.md``).
        variant: the checkpoint's input size: 224 (ResNet-50 through layer3, 14x14 maps), 512
            (through layer4, 16x16) or 1024 (32x32). The native image is resized to it as the
            authors do (`QueryDecoderModel.authors_transform`).
        channels_last: on CUDA, run the ResNet's convolutions channels-last (``xbench.models.gpu``).
    """

    display_name = "KAD"
    layer_groups: ClassVar[tuple[LayerGroup, ...]] = (
        *QueryDecoderModel.HEAD_GROUPS,
        LayerGroup("image projection", ("image_encoder.res_l1.*", "image_encoder.res_l2.*")),
        *resnet_stages("image_encoder.resnet"),
        *QueryDecoderModel.TEXT_GROUPS,
    )

    VARIANTS: ClassVar[tuple[int, ...]] = (224, 512, 1024)
    #: The ResNet's last stage the tokens come from (layer3 at 224, layer4 at 512 and 1024).
    cam_target: ClassVar[CamTarget] = CamTarget("image_encoder.res_features", QUERY_LOGIT)

    def __init__(
        self, checkpoint_dir: str = "checkpoints/kad", variant: int = 224, channels_last: bool = True, **kwargs
    ) -> None:
        if variant not in self.VARIANTS:
            raise ValueError(f"KAD variant must be one of {self.VARIANTS}; got {variant}")
        super().__init__(checkpoint_dir, **kwargs)
        self.channels_last = channels_last
        self.variant = variant
        self.preprocess = self.authors_transform(variant)
        self.image_encoder = ResNetTokens(through_layer4=variant != 224)

    def checkpoint_file(self) -> Path:
        return self.checkpoint_dir / f"KAD_{self.variant}" / "best_valid.pt"

    def convolutional_trunk(self) -> nn.Module:
        return self.image_encoder

    def check_file(self, loaded: Any, file: Path) -> None:
        """Name a variant mismatch, which the key match would only report as reshaped keys
        (224 vs 512/1024) or not at all (512 vs 1024: the same tensors)."""
        fix = f"set --model.variant to the file's, or place the KAD-{self.variant} file at {self.checkpoint_file()}"
        config = loaded.get("config") if isinstance(loaded, Mapping) else None
        trained_at = config.get("img_res") if isinstance(config, Mapping) else None
        if trained_at is not None and trained_at != self.variant:
            raise ValueError(
                f"{file} is a KAD-{trained_at} checkpoint (its config says img_res {trained_at}) "
                f"but the model is KAD-{self.variant}: {fix}"
            )
        image = loaded.get("image_encoder") if isinstance(loaded, Mapping) else None
        projector = image.get("res_l1.weight") if isinstance(image, Mapping) else None
        expected = 1024 if self.variant == 224 else 2048
        if isinstance(projector, Tensor) and projector.shape[0] != expected:
            file_variant = "KAD-224" if projector.shape[0] == 1024 else "KAD-512 or KAD-1024"
            raise ValueError(
                f"{file} holds a {projector.shape[0]}-wide projector res_l1, the layout of {file_variant}, "
                f"but the model is KAD-{self.variant}: {fix}"
            )
