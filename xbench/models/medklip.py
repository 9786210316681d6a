"""MedKLIP (Wu et al., ICCV 2023): one query per medical entity, decoded against a ResNet-50 grid.

Each of the 75 entities of the authors' vocabulary (76 with ``covid19``) is a query: the
Bio_ClinicalBERT ``[CLS]`` embedding of its description from ``observation explanation.json``,
projected to 256-d. A 4-layer pre-norm decoder lets the queries attend to each other and to the
196 image tokens; a 2-way classifier scores each query. The checkpoint holds no text weights, so
the queries are embedded at setup from the user's local BERT (cached on disk, see
`xbench.models.text.bert_cls_embeddings`).

Two rules keep the numbers the authors': the whole query book always runs (query self-attention
makes every entity's score depend on all the others), and a dataset's classes are picked out of
the book afterwards through `CLASS_ENTITIES`. Facts: ``specs/models/medklip.md``.
"""

from __future__ import annotations

from pathlib import Path
from typing import ClassVar

import torch
import torch.nn.functional as F
import torchvision
from torch import Tensor, nn

from xbench.files import read_json
from xbench.models.base import LayerGroup, XBenchModel, resnet_stages
from xbench.models.decoder import PreNormQueryLayer
from xbench.models.explainers import CamTarget
from xbench.models.checkpoints import CheckpointLayout, DeclaredDrop, has_shape, load_checkpoint
from xbench.models.hub import checkpoint_folder
from xbench.models.gpu import ChannelsLast
from xbench.geometry.preprocess import MapUpsample, Preprocess
from xbench.models.text import bert_cls_embeddings, require_files

#: The authors' entity vocabulary, in the order of their query book (RadGraph observation words).
ENTITIES: tuple[str, ...] = (
    "normal", "clear", "sharp", "sharply", "unremarkable", "intact", "stable", "free",
    "effusion", "opacity", "pneumothorax", "edema", "atelectasis", "tube", "consolidation", "process",
    "abnormality", "enlarge", "tip", "low", "pneumonia", "line", "congestion", "catheter",
    "cardiomegaly", "fracture", "air", "tortuous", "lead", "disease", "calcification", "prominence",
    "device", "engorgement", "picc", "clip", "elevation", "expand", "nodule", "wire",
    "fluid", "degenerative", "pacemaker", "thicken", "marking", "scar", "hyperinflate", "blunt",
    "loss", "widen", "collapse", "density", "emphysema", "aerate", "mass", "crowd",
    "infiltrate", "obscure", "deformity", "hernia", "drainage", "distention", "shift", "stent",
    "pressure", "lesion", "finding", "borderline", "hardware", "dilation", "chf", "redistribution",
    "aspiration", "tail_abnorm_obs", "excluded_obs",
)
#: Appended as the last query only when a class needs it, as the authors do for COVID datasets.
COVID_ENTITY = "covid19"
#: MedKLIP's own description file keys ``pneumonia`` as ``eumonia`` (same text); MAVL's copy fixes it.
DESCRIPTION_KEYS: dict[str, tuple[str, ...]] = {"pneumonia": ("pneumonia", "eumonia")}

#: Finding key -> the entities scored for it. Several entities: the highest score, the mean map.
CLASS_ENTITIES: dict[str, tuple[str, ...]] = {
    # The authors' tables: ChestX-ray14 (MedKLIP and MAVL test.py), CheXpert (MAVL test.py; also
    # CheXlocalize), RSNA, SIIM, COVID (MAVL configs). Fibrosis -> tail_abnorm_obs is theirs: fibrosis
    # is rare in MIMIC-CXR and was folded into the tail entity.
    "atelectasis": ("atelectasis",),
    "cardiomegaly": ("cardiomegaly",),
    "pleural_effusion": ("effusion",),
    "infiltration": ("infiltrate",),
    "mass": ("mass",),
    "nodule": ("nodule",),
    "pneumonia": ("pneumonia",),
    "pneumothorax": ("pneumothorax",),
    "consolidation": ("consolidation",),
    "edema": ("edema",),
    "emphysema": ("emphysema",),
    "fibrosis": ("tail_abnorm_obs",),
    "pleural_thickening": ("thicken",),
    "hernia": ("hernia",),
    "enlarged_cardiomediastinum": ("enlarge",),
    "lung_opacity": ("opacity",),
    "lung_lesion": ("lesion",),
    "pleural_other": ("abnormality",),
    "fracture": ("fracture",),
    "support_devices": ("device",),
    "covid19": (COVID_ENTITY,),
    # Ours (no authors' table): ChestX-Det10's calcification by name, and VinDr-CXR's classes as
    # proposed in specs/models/medklip.md section 4.4.
    "calcification": ("calcification",),
    "clavicle_fracture": ("fracture",),
    "rib_fracture": ("fracture",),
    "mediastinal_shift": ("shift",),
    "other_lesion": ("lesion",),
    "pulmonary_fibrosis": ("tail_abnorm_obs",),
    "interstitial_lung_disease": ("marking",),
    "aortic_enlargement": ("enlarge",),
    "enlarged_pa": ("enlarge",),
    "lung_cavity": ("tail_abnorm_obs",),
    "lung_cyst": ("tail_abnorm_obs",),
    "nodule_mass": ("nodule", "mass"),
    # Ours for the gaze datasets (REFLACX, EGD-CXR) and PadChest-GR: the entity that names the finding,
    # or its radiological sign.
    "abnormal_mediastinal_contour": ("widen",),
    "airway_wall_thickening": ("thicken",),
    "alveolar_pattern": ("opacity",),
    "aortic_elongation": ("tortuous",),
    "congestive_heart_failure": ("chf",),
    "costophrenic_angle_blunting": ("blunt",),
    "enlarged_hilum": ("prominence",),
    "groundglass_opacity": ("opacity",),
    "interstitial_pattern": ("marking",),
    "pleural_abnormality": ("effusion", "thicken"),
    "scoliosis": ("deformity",),
}

DESCRIPTIONS_FILE = "observation explanation.json"
INPUT_SIZE = 224


def entity_book(classes: list[str]) -> tuple[list[str], list[list[int]]]:
    """The query book for ``classes`` (all 75 entities, plus ``covid19`` if a class needs it) and,
    per class, the positions of its entities in the book."""
    unknown = [key for key in classes if key not in CLASS_ENTITIES]
    if unknown:
        raise ValueError(
            f"no MedKLIP/MAVL entity for class(es) {unknown}: add them to CLASS_ENTITIES in "
            f"xbench/models/medklip.py (entities: {', '.join(ENTITIES)}, {COVID_ENTITY})"
        )
    needed = {entity for key in classes for entity in CLASS_ENTITIES[key]}
    book = [*ENTITIES, *([COVID_ENTITY] if COVID_ENTITY in needed else [])]
    return book, [[book.index(entity) for entity in CLASS_ENTITIES[key]] for key in classes]


def read_json_object(path: Path) -> dict:
    try:
        data = read_json(path)
    except OSError as error:
        raise ValueError(f"cannot read {path}: {error.strerror}") from error
    if not isinstance(data, dict):
        raise ValueError(f"{path}: expected a JSON object (entity -> text); found {type(data).__name__}")
    return data


def read_descriptions(path: Path, book: list[str]) -> list[str]:
    """The description of each entity of ``book``, looked up by key (``eumonia`` accepted for pneumonia)."""
    data = read_json_object(path)
    texts = []
    for entity in book:
        key = next((k for k in DESCRIPTION_KEYS.get(entity, (entity,)) if k in data), None)
        if key is None:
            hint = (
                " The authors' MedKLIP file has no covid19 entry: use the 76-entry copy from the MAVL repository "
                "(see checkpoints/README.md)." if entity == COVID_ENTITY else ""
            )
            raise ValueError(f"{path}: no description for entity {entity!r} (the query book needs all of them).{hint}")
        if not isinstance(data[key], str) or not data[key].strip():
            raise ValueError(f"{path}: the description of {key!r} is not a non-empty string")
        texts.append(data[key])
    return texts


class QueryDecoder(nn.Module):
    """Four `PreNormQueryLayer` and a final LayerNorm, batch-first:
    queries [B, Q, D] over memory [B, T, D] -> queries and the per-layer cross-attention [L, B, Q, T]."""

    def __init__(self, width: int = 256, heads: int = 4, hidden: int = 1024, depth: int = 4) -> None:
        super().__init__()
        self.layers = nn.ModuleList(PreNormQueryLayer(width, heads, hidden) for _ in range(depth))
        self.norm = nn.LayerNorm(width)

    def forward(self, queries: Tensor, memory: Tensor) -> tuple[Tensor, Tensor]:
        queries, memory = queries.transpose(0, 1), memory.transpose(0, 1)
        attentions = []
        for layer in self.layers:
            queries, attention = layer(queries, memory)
            attentions.append(attention)
        return self.norm(queries).transpose(0, 1), torch.stack(attentions)


def resnet50_trunk() -> nn.Sequential:
    """torchvision ResNet-50 up to layer3 (stride 16, 1024 channels), untrained: the checkpoint fills it."""
    return nn.Sequential(*list(torchvision.models.resnet50(weights=None).children())[:-3])


class MedKLIPNet(nn.Module):
    """The tensors of ``checkpoint_final.pth`` (``medklip.keys.json`` less the declared drops)."""

    def __init__(self) -> None:
        super().__init__()
        self.res_features = resnet50_trunk()
        self.res_l1 = nn.Linear(1024, 1024)
        self.res_l2 = nn.Linear(1024, 256)
        self.disease_embedding_layer = nn.Linear(768, 256)
        self.decoder = QueryDecoder()
        self.classifier = nn.Linear(256, 2)

    def forward(self, pixels: Tensor, text: Tensor) -> tuple[Tensor, Tensor]:
        """Pixels [B, 3, 224, 224] and query text embeddings [Q, 768] -> classifier logits [B, Q, 2]
        and cross-attention [L, B, Q, h, w] (tokens row-major on the 14x14 grid)."""
        features = self.res_features(pixels)
        grid = features.shape[-2:]
        tokens = features.flatten(2).transpose(1, 2)
        memory = self.res_l2(F.relu(self.res_l1(tokens)))
        queries = self.disease_embedding_layer(text).expand(pixels.shape[0], -1, -1)
        output, attention = self.decoder(queries, memory)
        return self.classifier(output), attention.unflatten(-1, grid)


class MedKLIP(ChannelsLast, XBenchModel):
    """MedKLIP zero-shot: entity scores from the query decoder, maps from its cross-attention.

    Bio_ClinicalBERT (not MedKLIP's own weights) encodes the entity descriptions once, outside the
    network: its projection (``disease_embedding_layer``) and every layer after it are randomised.

    ``logits`` = l1 - l0 of the 2-way classifier for each class's entity (softmax index 1 is the
    authors' probability). ``maps`` = the head-averaged cross-attention averaged over the 4 decoder
    layers, the entity's row on the 14x14 grid (the authors' grounding recipe).

    Args:
        checkpoint_dir: folder with ``checkpoint_final.pth`` and ``observation explanation.json``.
        bert_dir: Bio_ClinicalBERT's ``config.json``, ``vocab.txt`` and weights; default
            ``<checkpoint_dir>/Bio_ClinicalBERT``.
        equalize_histogram: global histogram equalisation (256 bins) of the native image before the
            resize, as the authors' RSNA loader does (and no other loader of theirs); off by default.
        channels_last: on CUDA, run the ResNet's convolutions channels-last (``xbench.models.gpu``).
    """

    display_name = "MedKLIP"
    layer_groups: ClassVar[tuple[LayerGroup, ...]] = (
        LayerGroup("classifier", ("net.classifier.*",)),
        LayerGroup("query decoder", ("net.decoder.*",), blocks="net.decoder.layers"),
        LayerGroup("text projection", ("net.disease_embedding_layer.*",)),
        LayerGroup("image projection", ("net.res_l1.*", "net.res_l2.*")),
        *resnet_stages("net.res_features", stages={"6": "layer3", "5": "layer2", "4": "layer1"}),
    )

    #: The authors' map rule: their grounding scripts repeat each attention cell (nearest).
    map_rule: ClassVar[MapUpsample] = "nearest"
    #: The ResNet-50's layer3, the grid the decoder attends over.
    cam_target: ClassVar[CamTarget] = CamTarget(
        "net.res_features", "the query decoder's logit l1 - l0 of the class's entity (the highest of several)")
    checkpoint_layout: ClassVar[CheckpointLayout] = CheckpointLayout(
        section="model",
        strip_prefix="module.",  # the authors saved an nn.DataParallel
        drops=(
            DeclaredDrop("cl_fc.weight", "pre-training anatomy-contrast head, unused at inference", has_shape(768, 256)),
            DeclaredDrop("cl_fc.bias", "pre-training anatomy-contrast head, unused at inference", has_shape(768)),
        ),
    )

    def __init__(
        self,
        checkpoint_dir: str = "checkpoints/medklip",
        bert_dir: str | None = None,
        equalize_histogram: bool = False,
        channels_last: bool = True,
        **kwargs,
    ) -> None:
        super().__init__(**kwargs)
        self.channels_last = channels_last
        self.checkpoint_dir = checkpoint_folder(checkpoint_dir)
        self.checkpoint_file = "checkpoint_final.pth"
        self.bert_dir = (checkpoint_folder(bert_dir, "--model.bert_dir") if bert_dir
                         else self.checkpoint_dir / "Bio_ClinicalBERT")
        self.equalize_histogram = equalize_histogram
        # The authors' test transform: PIL ``Resize([224, 224])`` (bilinear, squashed) of the 8-bit
        # image, ToTensor, ImageNet's mean/std.
        self.preprocess = Preprocess(INPUT_SIZE, "squash", interpolation="bilinear", library="pil",
                                     equalize=equalize_histogram, map_upsample=self.map_rule)
        #: The authors' network, built and loaded by `build`.
        self.net: nn.Module | None = None
        #: The query book's text embeddings [Q, 768] (set by build).
        self.register_buffer("query_text", torch.empty(0, 768), persistent=False)
        #: Per class, its entities' rows in the book [C, K] (padded with its first entity) and their
        #: weights in the class's map (1/n each, 0 for padding): buffers, so that picking the classes
        #: out of the book needs no index copied from the host per batch.
        self.register_buffer("entity_index", torch.zeros(0, 1, dtype=torch.long), persistent=False)
        self.register_buffer("entity_weight", torch.zeros(0, 1), persistent=False)

    # -- what MAVL changes ------------------------------------------------------------------------

    def make_network(self) -> nn.Module:
        return MedKLIPNet()

    def text_files(self) -> tuple[str, ...]:
        return (DESCRIPTIONS_FILE,)

    def query_texts(self, book: list[str]) -> list[str]:
        """One text per query, in query order."""
        return read_descriptions(self.checkpoint_dir / DESCRIPTIONS_FILE, book)

    def convolutional_trunk(self) -> nn.Module:
        return self.net

    def entity_outputs(self, pixels: Tensor) -> tuple[Tensor, Tensor]:
        """Per entity of the book: log-odds [B, E] and raw maps [B, E, h, w]."""
        logits, attention = self.net(pixels, self.query_text)
        return logits[..., 1] - logits[..., 0], attention.mean(0)

    # -- the run ----------------------------------------------------------------------------------

    def build(self, classes: list[str]) -> None:
        what = f"{type(self).__name__} ({self.checkpoint_dir})"
        require_files(self.checkpoint_dir, (self.checkpoint_file, *self.text_files()), what)
        book, class_entities = entity_book(classes)
        width = max(len(rows) for rows in class_entities)
        device = self.query_text.device
        padding = [width - len(rows) for rows in class_entities]
        self.entity_index = torch.tensor([rows + rows[:1] * pad for rows, pad in zip(class_entities, padding)],
                                         device=device)
        self.entity_weight = torch.tensor([[1 / len(rows)] * len(rows) + [0.0] * pad
                                           for rows, pad in zip(class_entities, padding)], device=device)
        texts = self.query_texts(book)
        self.query_text = bert_cls_embeddings(self.bert_dir, texts, f"Bio_ClinicalBERT for {what}").to(self.query_text.device)
        if self.net is None:
            self.load_weights()

    def load_weights(self) -> None:
        """The network from the checkpoint, strictly: once per model, whatever the class sets."""
        net = self.make_network()
        load_checkpoint(net, self.checkpoint_dir / self.checkpoint_file, self.checkpoint_layout)
        self.net = net.to(self.query_text.device).train(self.training)

    def forward(self, pixels: Tensor) -> tuple[Tensor, Tensor]:
        scores, maps = self.entity_outputs(pixels)
        logits = scores[:, self.entity_index].amax(-1)  # a repeated entity leaves the maximum alone
        class_maps = (maps[:, self.entity_index] * self.entity_weight[..., None, None]).sum(2)
        return logits, class_maps

