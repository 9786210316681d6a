"""GLoRIA (Huang et al., ICCV 2021): a ResNet-50 image encoder and BioClinicalBERT, aligned
globally (image vector with report vector) and locally (words attending over image regions) on
CheXpert images and reports. Apache-2.0 licence.

What the authors' code does (``marshuang80/gloria`` at 416466a), and XBench with it:

- **Checkpoint**: ``chexpert_resnet50.ckpt``, the Lightning file of their ``PretrainModel``: the
  training config under ``hyper_parameters`` (an OmegaConf ``DictConfig``, read inertly and checked
  against `EXPECTED_HYPER_PARAMETERS`) and the weights under ``state_dict`` with the prefix
  ``gloria.``: torchvision's ResNet-50 without its ``fc`` (``img_encoder.model.*``),
  ``img_encoder.global_embedder`` (Linear 2048 -> 768), ``img_encoder.local_embedder`` (1x1 conv
  1024 -> 768, no bias) and BioClinicalBERT with its pooler (``text_encoder.model.*``, plus the
  ``position_ids`` buffer the transformers of 2021 saved). The BERT's config and vocabulary are
  ``emilyalsentzer/Bio_ClinicalBERT``'s, read from a local folder.
- **Input** (`GLoRIA.preprocess`): ``process_img``: ``cv2.imread(path, 0)``, the longer side to
  256 (``INTER_AREA``), the shorter zero-padded to a square (floor before, ceil after), then their
  test transform: ``CenterCrop(224)``, ``ToTensor``, ``Normalize(0.5, 0.5)``. Inside the image
  encoder the 224 crop is resized to 299 (bilinear, ``align_corners=True``); the regions are
  ResNet's layer-3 map, 19x19, the global vector layer 4 average-pooled.
- **Text**: ``process_text``: the cleaning CARZero also does (`clean_text`:
  lower case, ``\\w+`` words, a sentence of one word dropped), WordPiece padded to 97 tokens; the
  text tower sums BERT's last four hidden states, sums each word's pieces into one word vector
  (``[CLS]`` first, ``[SEP]`` last, empty slots after) and averages the 97 slots into the sentence
  vector. CARZero's text tower, built on GLoRIA's code, computes the same (each is checked against
  its authors' code); XBench has it once (`TextEncoder`).
- **Score**: ``get_similarities(..., "both")``: ``(global + local) / 2``. Global: the cosine of the
  image and sentence vectors. Local (``get_local_similarities``): the prompt's word vectors attend
  over the 361 regions (``attention_fn``: a softmax over the words per region, then, sharpened x4,
  over the regions per word); each word's cosine with its attended region vector, and
  ``log max_w exp(5 cos_w)``. Which word slots enter is the authors' quirk, kept: ``cap_lens``
  counts the *characters* of the prompt (``process_text`` iterates over the string), so slots
  1..len(prompt) enter: the words, ``[SEP]`` and empty slots (cosine 0). ``zero_shot_classification``
  then takes the best of a class's prompts and standardises each class over the evaluated images,
  which leaves its ranking as it is; XBench's logit is the per-image ``(global + local) / 2`` of one
  prompt (not calibrated log-odds).
- **Prompts**: the authors publish prompts only for CheXpert's five classes (random samples of
  severity x subtype x location). XBench's is one per class, ``there is <finding>``: a bare one-word
  finding would be dropped by the cleaning and embed as an empty text. A report phrase (phrase
  grounding) is its own prompt, as written; one of a single word goes into the template.
- **Map** (``attention_map``): by default the word-region attention of the local score (the
  ``attn`` that ``attention_fn`` returns and ``get_local_similarities`` discards), 19x19, the
  maximum over the prompt's words; or (``figure``) the map of the first panel of the authors'
  attention figures: ``get_attn_maps``' training-path attention, whose word softmax takes
  ``[CLS]`` and the words (not ``[SEP]`` and the empty slots), the maximum over all of them
  (``build_attention_images``). Placed on the 224 crop by bilinear upsampling (their figures add
  a Gaussian of sigma 20 px at 304 px, which XBench does not).
"""

from __future__ import annotations

from typing import ClassVar, Literal

import torch
import torch.nn.functional as F
import torchvision
from torch import Tensor, nn
from transformers import BertModel, PreTrainedTokenizerBase

from xbench.findings import finding_text
from xbench.models.base import LayerGroup, XBenchModel, resnet_stages
from xbench.models.carzero import TEXT_LAYERS, TEXT_SLOTS, TextEncoder, clean_text, tokenize_prompts
from xbench.models.checkpoints import CheckpointLayout, DeclaredDrop, is_arange, load_checkpoint, read_hyper_parameters
from xbench.models.hub import checkpoint_folder
from xbench.models.explainers import CamTarget
from xbench.geometry.precision import float32
from xbench.geometry.preprocess import Preprocess
from xbench.models.text import bert_from_config, load_tokenizer, require_files

CHECKPOINT_FILE = "chexpert_resnet50.ckpt"
TEXT_FOLDER = "Bio_ClinicalBERT"
#: ``cfg.model.text.embedding_dim``: the joint width, BERT's hidden size (no text projection).
WIDTH = 768
#: ``_resize_img``'s square and the test transform's ``CenterCrop``.
LETTERBOX_SIZE = 256
INPUT_SIZE = 224
#: ``resnet_forward`` resizes the 224 crop to this side before the ResNet; its layer 3 is then 19x19.
RESNET_INPUT = 299
#: ``get_local_similarities``: ``attention_fn``'s sharpening of the region softmax, and the word scale.
ATTENTION_SHARPNESS = 4.0
WORD_SCALE = 5.0
#: XBench's prompt (the authors have prompts for CheXpert's five classes only; see the module docstring).
TEMPLATE = "there is {}"
#: ``loss.gloria_loss.cosine_similarity``'s floor on the product of norms.
COSINE_EPS = 1e-8

#: The training-config values this implementation hard-codes, as dotted keys of ``hyper_parameters``.
EXPECTED_HYPER_PARAMETERS = {
    "model.vision.model_name": "resnet_50",
    "model.text.last_n_layers": TEXT_LAYERS,
    "model.text.aggregate_method": "sum",
    "model.text.agg_tokens": True,
    "model.text.norm": False,
    "model.text.embedding_dim": WIDTH,
    "data.text.word_num": TEXT_SLOTS,
    "data.image.imsize": LETTERBOX_SIZE,
    "transforms.norm": "half",
    "transforms.random_crop.crop_size": INPUT_SIZE,
}

CHECKPOINT_LAYOUT = CheckpointLayout(
    section="state_dict",
    strip_prefix="gloria.",
    drops=(
        DeclaredDrop(
            "text_encoder.model.embeddings.position_ids",
            "a buffer transformers < 4.31 saved; newer versions rebuild it",
            is_arange,
        ),
    ),
)


class ImageEncoder(nn.Module):
    """The authors' ``ImageEncoder`` in their file's layout: ResNet-50 (``fc`` removed) and the two embedders."""

    def __init__(self, width: int = WIDTH) -> None:
        super().__init__()
        self.model = torchvision.models.resnet50()
        self.model.fc = nn.Identity()
        self.global_embedder = nn.Linear(2048, width)
        self.local_embedder = nn.Conv2d(1024, width, kernel_size=1, bias=False)

    def forward(self, x: Tensor) -> tuple[Tensor, Tensor]:
        """Input [B, 3, 224, 224] -> global [B, D], regions [B, D, 19, 19] (``image_encoder_forward``)."""
        x = F.interpolate(x, size=(RESNET_INPUT, RESNET_INPUT), mode="bilinear", align_corners=True)
        resnet = self.model
        x = resnet.maxpool(resnet.relu(resnet.bn1(resnet.conv1(x))))
        regions = resnet.layer3(resnet.layer2(resnet.layer1(x)))
        pooled = resnet.layer4(regions).mean(dim=(2, 3))
        return self.global_embedder(pooled), self.local_embedder(regions)


class GLoRIANetwork(nn.Module):
    """The two towers under the authors' names, so the state dict matches their file."""

    def __init__(self, bert: BertModel) -> None:
        super().__init__()
        self.text_encoder = TextEncoder(bert)
        self.img_encoder = ImageEncoder(bert.config.hidden_size)


def cosine(a: Tensor, b: Tensor, dim: int) -> Tensor:
    """``loss.gloria_loss.cosine_similarity``: the product of the norms floored, not each norm."""
    return (a * b).sum(dim) / (a.norm(dim=dim) * b.norm(dim=dim)).clamp(min=COSINE_EPS)


def word_attention(words: Tensor, regions: Tensor) -> Tensor:
    """``attention_fn``: word slots [n, D] over images' regions [B, D, h, w] -> [B, n, R], a softmax
    over the words per region, then, sharpened x4, over the regions per word."""
    scores = torch.einsum("bdr,nd->brn", regions.flatten(2), words)
    return torch.softmax(torch.softmax(scores, dim=-1).transpose(1, 2) * ATTENTION_SHARPNESS, dim=-1)


def local_similarity(words: Tensor, regions: Tensor) -> tuple[Tensor, Tensor]:
    """One prompt's word slots [n, D] against images' regions [B, D, h, w]: the local score [B]
    (``log max_w exp(5 cos_w)``) and the word-region attention [B, n, h, w] (``attention_fn``)."""
    batch, _, height, columns = regions.shape
    context = regions.flatten(2)  # [B, D, R]
    attention = word_attention(words, regions)
    attended = attention @ context.transpose(1, 2)  # [B, n, D]
    similarity = torch.exp(cosine(words.expand(batch, -1, -1), attended, dim=-1) * WORD_SCALE)
    return torch.log(similarity.max(dim=1).values), attention.unflatten(-1, (height, columns))


class GLoRIA(XBenchModel):
    """GLoRIA from the authors' files (see the module docstring for the recipe).

    Args:
        checkpoint_dir: the folder holding ``chexpert_resnet50.ckpt`` and ``Bio_ClinicalBERT/``
            (``config.json``, ``vocab.txt``); see ``checkpoints/README.md``.
        template: the prompt; ``{}`` is replaced by the finding's text. At least two words.
        attention_map: the map: ``zero_shot`` (default), the attention of the zero-shot local score
            (a softmax over the prompt's words, ``[SEP]`` and the empty slots, ``[CLS]`` left out),
            the maximum over the words; or ``figure``, the authors' attention figures' first panel
            (``get_attn_maps``: the training path's attention over ``[CLS]`` and the words, the
            maximum over all of them). The default is the attention behind the score XBench reports.
    """

    display_name = "GLoRIA"
    calibrated_logits: ClassVar[bool] = False  # (global + local) / 2: a similarity, no tuned cut
    query_mode = "phrase"
    #: The ResNet-50's layer3: the regions of the local score, and through layer4 the global vector.
    cam_target: ClassVar[CamTarget] = CamTarget(
        "network.img_encoder.model.layer3", "the authors' score (global + local) / 2 of the class's prompt")
    layer_groups: ClassVar[tuple[LayerGroup, ...]] = (
        LayerGroup("image projections", ("network.img_encoder.global_embedder.*", "network.img_encoder.local_embedder.*")),
        *resnet_stages("network.img_encoder.model"),
        LayerGroup("text tower", ("network.text_encoder.*",), blocks="network.text_encoder.model.encoder.layer",
                   text=True),
    )
    preprocess: ClassVar[Preprocess] = Preprocess(
        INPUT_SIZE, "longer_side", resize_to=LETTERBOX_SIZE, interpolation="area", library="cv2", mean=(0.5, 0.5, 0.5),
        std=(0.5, 0.5, 0.5), map_upsample="bilinear",
    )

    def __init__(self, checkpoint_dir: str = "checkpoints/gloria", template: str = TEMPLATE,
                 attention_map: Literal["zero_shot", "figure"] = "zero_shot", **kwargs) -> None:
        super().__init__(**kwargs)
        if template.count("{}") != 1:
            raise ValueError(f"a prompt template needs exactly one '{{}}' for the finding; got {template!r}")
        if attention_map not in ("zero_shot", "figure"):
            raise ValueError(f"--model.attention_map must be zero_shot or figure; got {attention_map!r}")
        self.attention_map = attention_map
        self.checkpoint_dir = checkpoint_folder(checkpoint_dir)
        self.template = template
        self.network: GLoRIANetwork | None = None
        self.tokenizer: PreTrainedTokenizerBase | None = None
        self.prompts: list[str] = []
        #: Per class: how many word slots after ``[CLS]`` enter the local score (the prompt's
        #: characters), and how many of those are the prompt's words (the map's); int64 tensors
        #: while phrases stand in for the classes (`encode_phrases`).
        self.word_lengths: list[int] | Tensor = []
        self.word_counts: list[int] | Tensor = []

    def load_weights(self) -> None:
        """Both towers from the checkpoint, strictly; BERT shaped by the local ``config.json``; the
        file's training config checked against what XBench hard-codes."""
        folder = self.checkpoint_dir
        file = require_files(folder, (CHECKPOINT_FILE,), "GLoRIA") / CHECKPOINT_FILE
        bert = bert_from_config(folder / TEXT_FOLDER, "GLoRIA's Bio_ClinicalBERT")
        if bert.config.hidden_size != WIDTH:
            raise ValueError(
                f"{folder / TEXT_FOLDER / 'config.json'}: hidden_size {bert.config.hidden_size}, but GLoRIA's "
                f"joint space is {WIDTH} wide; use the config.json of emilyalsentzer/Bio_ClinicalBERT"
            )
        network = GLoRIANetwork(bert)
        loaded = load_checkpoint(network, file, CHECKPOINT_LAYOUT)
        read_hyper_parameters(loaded, file, EXPECTED_HYPER_PARAMETERS)
        self.network = network.eval().requires_grad_(False)

    def build(self, classes: list[str]) -> None:
        if self.network is None:
            self.load_weights()
        self.tokenizer = load_tokenizer(self.checkpoint_dir / TEXT_FOLDER,
                                        "GLoRIA's Bio_ClinicalBERT")
        self.prompts = [self.template.format(finding_text(key)) for key in classes]
        text = self.encode_prompts(self.prompts)
        self.word_lengths, self.word_counts = text.pop("word_lengths").tolist(), text.pop("word_counts").tolist()
        for name, value in text.items():
            self.register_buffer(name, value, persistent=False)

    @torch.no_grad()
    def encode_prompts(self, prompts: list[str], cap_lengths: bool = False) -> dict[str, Tensor]:
        """What ``forward`` reads for N prompts, on the model's device: word slots ``words`` [N, 97, D]
        and sentence vectors ``sentences`` [N, D], as the authors' ``process_text`` and ``BertEncoder``;
        ``word_lengths`` [N], the slots after ``[CLS]`` the local score takes, and ``word_counts`` [N],
        the prompt's words (slots between ``[CLS]`` and ``[SEP]``), the map's. ``cap_lengths``: a
        prompt of more characters than slots takes all the slots instead of failing."""
        # cap_lens: the prompt's characters other than "[" (the authors iterate over the string)
        lengths = [sum(character != "[" for character in prompt) for prompt in prompts]
        if cap_lengths:
            lengths = [min(length, TEXT_SLOTS - 1) for length in lengths]
        for prompt, length in zip(prompts, lengths):
            if length + 1 > TEXT_SLOTS:
                raise ValueError(f"prompt {prompt!r} has {length} characters; GLoRIA's local score takes at most "
                                 f"{TEXT_SLOTS - 1} (the authors' code fails on a longer one)")
        tokens, merge = tokenize_prompts(
            self.tokenizer, prompts, "GLoRIA", f"{TEXT_FOLDER}/vocab.txt Bio_ClinicalBERT's vocabulary")
        counts = [int(row.any(dim=1).sum()) - 2 for row in merge]  # the filled slots but [CLS] and [SEP]
        tokens = tokens.to(self.device)
        words, sentences = self.network.text_encoder(tokens["input_ids"], tokens["attention_mask"], merge)
        return {"words": words, "sentences": sentences, "word_lengths": torch.tensor(lengths, device=self.device),
                "word_counts": torch.tensor(counts, device=self.device)}

    def encode_phrases(self, phrases: list[str]) -> dict[str, Tensor]:
        """Each phrase as its prompt, as written, not in ``template``. A phrase the authors' cleaning
        empties (it drops a one-word sentence) goes into ``template``, as a one-word finding does. A
        phrase of more than 96 characters, on which the authors' code fails (it takes a prompt's
        characters as its word slots), takes all 96 slots: its words then share the attention with
        the padding slots after them, as every prompt's words do."""
        return self.encode_prompts([phrase if clean_text(phrase) else self.template.format(phrase)
                                    for phrase in phrases], cap_lengths=True)

    def forward(self, model_input: Tensor) -> tuple[Tensor, Tensor]:
        """Model input [B, 3, 224, 224] -> scores [B, C] = (global + local) / 2, maps [B, C, 19, 19]."""
        if self.network is None:
            raise RuntimeError("GLoRIA is not built: call build(classes) first (trainer.test does it in setup)")
        image, regions = self.network.img_encoder(model_input)
        with float32(regions):
            image, regions = image.float(), regions.float()
            global_scores = F.normalize(image, dim=-1) @ F.normalize(self.sentences, dim=-1).T
            local_scores, maps = [], []
            for slots, length, count in zip(self.words, self.word_lengths, self.word_counts):
                score, attention = local_similarity(slots[1 : length + 1], regions)
                local_scores.append(score)
                if self.attention_map == "figure":  # [CLS] and the words alone share the word softmax
                    attention = word_attention(slots[: count + 1], regions).unflatten(-1, regions.shape[-2:])
                    maps.append(attention.amax(dim=1))
                else:
                    maps.append(attention[:, :count].amax(dim=1))
            return (global_scores + torch.stack(local_scores, dim=1)) / 2, torch.stack(maps, dim=1)
