"""Phrase grounding (``query_mode = "phrase"``): each free-text model embeds a report phrase in its
own prompt style for phrases (``encode_phrases``) and grounds it with the classes' path
(``phrase_maps``), on the random weights the model tests use.

- Dual encoders (CLIP, BiomedCLIP, CheXzero, BioViL) and CARZero, GLoRIA: a phrase whose prompt is a
  class's prompt gets that class's map from ``forward``; the phrase's prompt is the template-wrapped
  (dual encoders) or raw (CARZero, GLoRIA) phrase.
- KAD, DeViDe: a phrase is decoded alone, as a query set of one, so its map does not depend on the
  batch's other phrases (which it would if decoded with them: queries attend to each other).
- Every phrase model: a phrase's map does not depend on which rows are sliced beside it, and the
  classes' text side is back in place after ``phrase_maps``; with a CAM explainer (CLIP's Grad-CAM;
  KAD's and DeViDe's, each phrase decoded alone) too.
- Each of these models' declared CAM layer is on its scores' path and covers its input
  (``conftest.assert_cam_declaration``).
"""

from __future__ import annotations

import warnings

import pytest
import torch
from safetensors.torch import save_file
from transformers import BertConfig, BertModel

from conftest import assert_cam_declaration, tiny_clip_state

from xbench.findings import finding_text
from xbench.models import random_weights
from xbench.models.baselines import CentrePrior, Oracle, RandomSaliency
from xbench.models.biomedclip import BiomedCLIP
from xbench.models.biovil import BioViL, BioViLT
from xbench.models.carzero import TEXT_FOLDER as CARZERO_TEXT, Architecture, CARZero, CARZeroNetwork
from xbench.models.chexzero import CHECKPOINT_FILE as CHEXZERO_FILE, CheXzero
from xbench.models.clip import CLIP
from xbench.models.devide import DeViDe
from xbench.models.gloria import GLoRIA
from xbench.models.kad import KAD
from xbench.models.mavl import MAVL
from xbench.models.medklip import MedKLIP
from xbench.models.precomputed import PrecomputedSaliency
from xbench.models.radzero import RadZero

CLASSES = ["pneumonia", "pleural_effusion", "nodule"]
PHRASE = "small left apical pneumothorax"
TINY_CLIP = "xbench-phrase-tiny-clip"
CARZERO_TINY = Architecture(width=32, vision_depth=1, vision_heads=2, fusion_layers=2, fusion_heads=4, fusion_ffn=64,
                            head_widths=(16,))
CARZERO_VOCAB = ["[PAD]", "[UNK]", "[CLS]", "[SEP]", "[MASK]", "there", "is", "lung", "nod", "##ule", "pulmonary",
                 "mass", "pneumonia", "small", "left", "apical", "pneum", "##oth", "##orax"]


@pytest.fixture(scope="module", autouse=True)
def one_thread():
    """Tiny tensors: a second thread costs more than it saves."""
    threads = torch.get_num_threads()
    torch.set_num_threads(1)
    yield
    torch.set_num_threads(threads)


def rows_of(encoded: dict[str, torch.Tensor], ids: list[int]) -> dict[str, torch.Tensor]:
    """A batch's rows, sliced as the base slices them."""
    return {name: value[torch.tensor(ids)] for name, value in encoded.items()}


def close(a: torch.Tensor, b: torch.Tensor, atol: float = 1e-6) -> None:
    torch.testing.assert_close(a, b, rtol=0, atol=atol)


# -- the models, each built on CLASSES with random weights ------------------------------------------


def clip_family(name: str, folder, **kwargs):
    if name in ("clip", "clip_gradcam", "chexzero"):
        state = tiny_clip_state(folder, TINY_CLIP, vision_layers=1)
        if name == "chexzero":
            torch.save(state, folder / CHEXZERO_FILE)
            return CheXzero(checkpoint_dir=str(folder), arch=TINY_CLIP), 32
        save_file(state, folder / "open_clip_model.safetensors")
        explainer = "gradcam" if name == "clip_gradcam" else "native"
        return CLIP(checkpoint_dir=str(folder), arch=TINY_CLIP, explainer=explainer), 32
    # BiomedCLIP: test_biomedclip's tiny geometry (timm's test_vit, a 1-layer BERT)
    model_cfg = random_weights.BIOMEDCLIP_CONFIG["model_cfg"]
    config = {**random_weights.BIOMEDCLIP_CONFIG, "model_cfg": {
        **model_cfg, "embed_dim": 16, "vision_cfg": {**model_cfg["vision_cfg"], "timm_model_name": "test_vit"}}}
    bert = BertConfig(vocab_size=64, hidden_size=32, num_hidden_layers=1, num_attention_heads=2, intermediate_size=64)
    random_weights.write_biomedclip_files(folder, config, bert, vocab_size=64)
    torch.save(random_weights.biomedclip_state(folder, 0), folder / "open_clip_pytorch_model.bin")
    return BiomedCLIP(checkpoint_dir=str(folder)), 160


def build_model(name: str, folder):
    """(model built on CLASSES, input side, phrase_of: class index -> the phrase whose prompt is that class's).
    ``folder``: BioViL's and GLoRIA's checkpoint folder (:func:`model_folder`), else an empty one to write in."""
    if name == "biovil":
        model, side = BioViL(checkpoint_dir=str(folder)), 96
    elif name == "carzero":
        torch.manual_seed(0)
        text = folder / CARZERO_TEXT
        text.mkdir()
        (text / "vocab.txt").write_text("\n".join(CARZERO_VOCAB) + "\n")
        config = BertConfig(vocab_size=len(CARZERO_VOCAB), hidden_size=CARZERO_TINY.width, num_hidden_layers=4,
                            num_attention_heads=2, intermediate_size=64, max_position_embeddings=128)
        config.save_pretrained(text)
        model, side = CARZero(checkpoint_dir=str(folder)), 224
        model.network = CARZeroNetwork(BertModel(config), CARZERO_TINY).eval()  # build loads no weights then
        with torch.no_grad():
            for parameter in model.network.parameters():
                parameter.add_(torch.randn_like(parameter) * 0.05)
    elif name == "gloria":
        model, side = GLoRIA(checkpoint_dir=str(folder)), 224
    else:
        model, side = clip_family(name, folder)
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")  # CARZero's vocabulary names no prompt's every word
        model.build(["nodule", "mass", "pneumonia"] if name == "carzero" else CLASSES)
    model.eval()
    if name in ("carzero", "gloria"):  # the phrase as is: a class's own prompt string
        return model, side, lambda c: model.prompts[c]
    return model, side, lambda c: finding_text(CLASSES[c])


def model_folder(name: str, request, tmp_path_factory):
    """:func:`build_model`'s ``folder``: the session's full-size BioViL or GLoRIA (conftest), else a new one."""
    if name in ("biovil", "gloria"):
        return request.getfixturevalue(f"{name}_folder")
    return tmp_path_factory.mktemp(name)


TEXT_MODELS = ["clip", "clip_gradcam", "biomedclip", "chexzero", "biovil", "carzero", "gloria"]


@pytest.fixture(scope="module", params=TEXT_MODELS)
def text_model(request, tmp_path_factory):
    model, side, phrase_of = build_model(request.param, model_folder(request.param, request, tmp_path_factory))
    pixels = torch.rand(2, 3, side, side, generator=torch.Generator().manual_seed(1))
    with torch.no_grad():
        logits, maps = model.explain(pixels)
    return request.param, model, pixels, phrase_of, maps


def test_a_class_prompt_as_a_phrase_gives_the_class_map(text_model):
    name, model, pixels, phrase_of, maps = text_model
    # rows in another order than the classes, sliced as the base slices a batch's phrases
    encoded = model.encode_phrases([phrase_of(2), PHRASE, phrase_of(0)])
    grounded = model.phrase_maps(pixels, rows_of(encoded, [2, 0]))
    close(grounded, maps[:, [0, 2]])
    other = model.phrase_maps(pixels, rows_of(encoded, [1]))
    assert (other[:, 0] - maps[:, 0]).abs().max() > 1e-4, "a phrase that is no class's prompt got a class's map"
    # a phrase's map does not depend on the rows beside it, and the classes' text side is back
    close(model.phrase_maps(pixels, rows_of(encoded, [1, 2, 0]))[:, :1], other)
    close(model.phrase_maps(pixels, rows_of(model.encode_phrases([PHRASE]), [0])), other)
    close(model.explain(pixels)[1], maps)


def test_the_declared_cam_layer_is_on_the_scores_path(text_model):
    name, model, pixels, *_ = text_model
    assert_cam_declaration(model, pixels)


@pytest.mark.parametrize("name, pos_template", [("clip", "{}"), ("biomedclip", "this is a photo of {}"),
                                                ("chexzero", "{}"), ("biovil", "{}")])
def test_dual_encoders_wrap_the_phrase_in_their_prompt_pair(name, pos_template, request, tmp_path_factory):
    model, *_ = build_model(name, model_folder(name, request, tmp_path_factory))
    assert model.pos_template == pos_template
    encoded = model.encode_phrases([PHRASE])
    close(encoded["pos_text"], model.embed_text([pos_template.format(PHRASE)]))
    close(encoded["neg_text"], model.embed_text([model.neg_template.format(PHRASE)]))


@pytest.mark.parametrize("name, one_word", [("carzero", "There is pneumonia"), ("gloria", "there is pneumonia")])
def test_carzero_and_gloria_take_the_phrase_as_written(name, one_word, request, tmp_path_factory):
    model, *_ = build_model(name, model_folder(name, request, tmp_path_factory))
    for phrase, prompt in ((PHRASE, PHRASE), ("pneumonia", one_word)):  # one word: the cleaning would drop it
        encoded, direct = model.encode_phrases([phrase]), model.encode_prompts([prompt])
        assert encoded.keys() == direct.keys()
        for key in encoded:
            close(encoded[key], direct[key])


def test_gloria_grounds_a_phrase_longer_than_its_word_slots(gloria_folder):
    """The authors' code fails on a prompt of more than 96 characters (it counts characters as word
    slots); a report phrase that long takes all 96 slots, a shorter one its characters, as a class
    prompt does."""
    model, side, _ = build_model("gloria", gloria_folder)
    phrase = "moderate right pleural effusion with adjacent basilar atelectasis, unchanged from the prior study"
    assert len(phrase) > 96
    with pytest.raises(ValueError, match="characters"):
        model.encode_prompts([phrase])
    encoded = model.encode_phrases([phrase, PHRASE])
    assert encoded["word_lengths"].tolist() == [96, len(PHRASE)]
    close(encoded["words"][1:], model.encode_prompts([PHRASE])["words"])
    pixels = torch.rand(1, 3, side, side, generator=torch.Generator().manual_seed(2))
    assert torch.isfinite(model.phrase_maps(pixels, encoded)).all()


# -- KAD, DeViDe: one query set per phrase -----------------------------------------------------------


@pytest.fixture(scope="module", params=["kad", "devide"])
def query_model(request, tmp_path_factory):
    folder = tmp_path_factory.mktemp(request.param)
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")  # DeViDe's provisional layout
        if request.param == "kad":
            model, side = KAD(checkpoint_dir=str(random_weights.write_kad(folder))), 64
        else:
            model, side = DeViDe(checkpoint_dir=str(random_weights.write_devide(folder))), 224
        model.eval().build(["pneumothorax", "nodule", "pleural_effusion"])
    return model, torch.rand(1, 3, side, side, generator=torch.Generator().manual_seed(1))


def test_each_phrase_is_decoded_as_a_query_set_of_its_own(query_model):
    model, pixels = query_model
    encoded = model.encode_phrases(["pneumothorax", "lung nodule", "pleural effusion"])
    # the phrase path embeds as the class path does
    close(encoded["queries"][0], model.queries[model.prompts.index("pneumothorax")])
    # the random weights' maps are near uniform (DeViDe's ~1/196): tight bounds, and the joint
    # decoding's difference (2e-5 for DeViDe) far above them
    alone = model.phrase_maps(pixels, rows_of(encoded, [1]))
    with model.text_side({"queries": encoded["queries"][1:2], "query_index": torch.tensor([0])}):
        close(alone, model(pixels)[1], atol=1e-7)
    close(model.phrase_maps(pixels, rows_of(encoded, [2, 1, 0]))[:, 1:2], alone, atol=1e-7)
    with model.text_side({"queries": encoded["queries"], "query_index": torch.tensor([0, 1, 2])}):
        together = model(pixels)[1][:, 1:2]
    assert (together - alone).abs().max() > 1e-5, "decoded together, queries would interact: the test shows nothing"


def test_a_cam_explains_each_phrase_decoded_alone(query_model):
    model, pixels = query_model
    assert_cam_declaration(model, pixels)
    encoded = model.encode_phrases(["pneumothorax", "lung nodule"])
    model.explainer = "gradcam"
    try:
        with torch.no_grad():
            both = model.phrase_maps(pixels, rows_of(encoded, [0, 1]))
            with model.text_side({"queries": encoded["queries"][1:2], "query_index": torch.tensor([0])}):
                close(both[:, 1:], model.explain(pixels)[1], atol=1e-6)
    finally:
        model.explainer = "native"


# -- which models ground phrases ---------------------------------------------------------------------


@pytest.mark.parametrize("model, mode", [
    *((model, "phrase") for model in (CLIP, BiomedCLIP, CheXzero, BioViL, BioViLT, CARZero, GLoRIA, KAD, DeViDe,
                                                 RadZero)),
    *((model, "finding") for model in (MedKLIP, MAVL, RandomSaliency, CentrePrior, Oracle, PrecomputedSaliency)),
])
def test_query_mode(model, mode):
    assert model.query_mode == mode
