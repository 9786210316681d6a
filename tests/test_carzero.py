"""CARZero: the authors' checkpoint layout, the text tower, the fusion maths, the frame geometry, a run."""

import argparse
import json
import math
import sys
import types
import typing
import warnings
from collections import defaultdict
from contextlib import contextmanager
from pathlib import Path

import cv2
import numpy as np
import pandas as pd
import pytest
import torch
import torch.nn.functional as F
from transformers import BertConfig, BertModel

from conftest import assert_bf16_mixed_close_to_fp32, run_args
from xbench.data.phantom import Phantom
from xbench.findings import PAPER_CLASSES
from xbench.models.carzero import (
    CARZero,
    CARZeroNetwork,
    Architecture,
    OFFICIAL_PROMPTS,
    TEMPLATE_CLASSES,
    clean_text,
    prompt_for,
    word_merge_matrix,
)
from xbench.models.checkpoints import CheckpointMismatchError, manifest, omegaconf_values, safe_load
from xbench.geometry.preprocess import area_resize
from xbench.geometry.maps import place_in_frame
from xbench.models.text import load_tokenizer
from xbench.test import main

# Most geometry tests use small batch images on purpose; the upsampling note has its own test.
pytestmark = pytest.mark.filterwarnings("ignore:the model's input is 256x256:UserWarning")

REPO = Path(__file__).resolve().parents[1]
TINY = Architecture(width=32, vision_depth=1, vision_heads=2, fusion_layers=4, fusion_heads=4, fusion_ffn=64,
                    head_widths=(48, 24, 16))
VOCAB = ["[PAD]", "[UNK]", "[CLS]", "[SEP]", "[MASK]", "there", "is", "lung", "nod", "##ule", "pulmonary", "mass",
         "consolidation", "pneum", "##oth", "##orax"]


@pytest.fixture(scope="module", autouse=True)
def one_thread():
    """Tiny tensors: handing work to a second thread costs more than it saves (seconds per call
    when the CPU is shared), so this module runs single-threaded."""
    threads = torch.get_num_threads()
    torch.set_num_threads(1)
    yield
    torch.set_num_threads(threads)


# -- the authors' file, written as PyTorch Lightning 1.1 wrote it --------------------------------


class _Pickled:
    """Attributes become the pickled state (what OmegaConf's ``__getstate__`` returns)."""

    def __init__(self, **state):
        self.__dict__.update(state)


FOREIGN_CLASSES = {
    "omegaconf.dictconfig": ("DictConfig",),
    "omegaconf.listconfig": ("ListConfig",),
    "omegaconf.nodes": ("AnyNode",),
    "omegaconf.base": ("Metadata", "ContainerMetadata"),
    "pytorch_lightning.callbacks.model_checkpoint": ("ModelCheckpoint",),
    "pytorch_lightning.callbacks.early_stopping": ("EarlyStopping",),
}


@contextmanager
def foreign_classes():
    """Stand-ins importable as ``omegaconf.*`` / ``pytorch_lightning.*`` while a file is written
    (neither package is installed). They pickle as the real ones do: ``NEWOBJ`` + a state dict."""
    with pytest.MonkeyPatch.context() as patch:
        modules, classes = {}, {}
        for module_name, names in FOREIGN_CLASSES.items():
            parts = module_name.split(".")
            for name in (".".join(parts[:depth]) for depth in range(1, len(parts) + 1)):
                if name not in modules:
                    modules[name] = types.ModuleType(name)
                    patch.setitem(sys.modules, name, modules[name])
            for name in names:
                classes[name] = type(name, (_Pickled,), {"__module__": module_name, "__qualname__": name})
                setattr(modules[module_name], name, classes[name])
        yield classes


def as_omegaconf(value, classes, parent=None, key=None):
    """``value`` as OmegaConf 2.3 holds it: containers with ``_content``, leaf nodes with ``_val``."""
    if isinstance(value, (dict, list)):
        kind = "DictConfig" if isinstance(value, dict) else "ListConfig"
        metadata = classes["ContainerMetadata"](
            ref_type=typing.Any, object_type=type(value), optional=True, key=key, flags={}, flags_root=False,
            resolver_cache=defaultdict(dict), key_type=typing.Any, element_type=typing.Any,
        )
        node = classes[kind](_metadata=metadata, _parent=parent)
        items = value.items() if isinstance(value, dict) else enumerate(value)
        content = {k: as_omegaconf(v, classes, node, k) for k, v in items}
        node._content = content if isinstance(value, dict) else list(content.values())
        return node
    metadata = classes["Metadata"](ref_type=typing.Any, object_type=None, optional=True, key=key, flags={})
    return classes["AnyNode"](_metadata=metadata, _parent=parent, _val=value)


def authors_config(architecture):
    """``configs/mimic_pretrain_llm_dqn_wo_self_atten_mlp_gl.yaml`` (widths from ``architecture``)."""
    return {
        "experiment_name": "CARZero_Globa_local_MLP",
        "phase": "pretrain_llm_dqn_wo_self_atten_mlp_gl",
        "lightning": {"trainer": {"gpus": "0", "max_epochs": 15, "precision": 16, "lr": 5e-05}},
        "model": {
            "norm": False,
            "vision": {"model_name": "vit_b_16", "base": "transformer", "freeze_cnn": False, "pretrained": True},
            "text": {"bert_type": "Laihaoran/BioClinicalMPBERT", "last_n_layers": 4, "aggregate_method": "sum",
                     "norm": False, "embedding_dim": architecture.width, "freeze_bert": False, "agg_tokens": True},
            "fusion": {"d_model": architecture.width, "H": 4, "N": 4, "dropout": 0.1, "state_prob": 1,
                       "class_num": 1, "decoder_number_layer": architecture.fusion_layers},
        },
        "data": {"dataset": "pretrain_xh", "text": {"word_num": 97, "captions_per_image": 5}, "image": {"imsize": 256}},
        "transforms": {"norm": "CXR_MAE", "random_crop": {"crop_size": 224},
                       "random_affine": {"degrees": 30, "translate": [0.1, 0.1]}},
    }


def write_authors_checkpoint(path, network, config=None, edit=None, hyper_parameters=None):
    """A Lightning 1.1 ``CARZero_best_model.ckpt``: every key under ``CARZero.``, the config as a
    DictConfig, callbacks keyed by their classes, Adam moments, AMP state."""
    state = {f"CARZero.{key}": value.clone() for key, value in network.state_dict().items()}
    if edit is not None:
        edit(state)
    copy = CARZeroNetwork(BertModel(network.text_encoder.model.config), TINY)
    optimizer = torch.optim.Adam(copy.parameters(), lr=5e-5)
    for parameter in copy.parameters():
        parameter.grad = torch.ones_like(parameter)
    optimizer.step()
    with foreign_classes() as classes:
        if hyper_parameters is None:
            hyper_parameters = as_omegaconf(config or authors_config(TINY), classes)
        torch.save({
            "epoch": 11,
            "global_step": 4321,
            "pytorch-lightning_version": "1.1.4",
            "callbacks": {
                classes["ModelCheckpoint"]: {"monitor": "val_loss", "best_model_score": torch.tensor(0.42),
                                             "best_model_path": "./data/ckpt/epoch=11.ckpt"},
                classes["EarlyStopping"]: {"wait_count": 0, "patience": 10},
            },
            "optimizer_states": [optimizer.state_dict()],
            "lr_schedulers": [{"mode": "min", "best": 0.42, "num_bad_epochs": 0}],
            "native_amp_scaling_state": {"scale": 65536.0, "growth_factor": 2.0, "_growth_tracker": 17},
            "state_dict": state,
            "hyper_parameters": hyper_parameters,
            "hparams_type": classes["DictConfig"],
        }, path)
    return path


@pytest.fixture(scope="module")
def source_network():
    """A tiny CARZero with random weights (LayerNorms too, so a swapped key would show)."""
    torch.manual_seed(0)
    config = BertConfig(vocab_size=len(VOCAB), hidden_size=TINY.width, num_hidden_layers=5, num_attention_heads=2,
                        intermediate_size=64, max_position_embeddings=128)
    network = CARZeroNetwork(BertModel(config), TINY).eval()
    with torch.no_grad():
        for parameter in network.parameters():
            parameter.add_(torch.randn_like(parameter) * 0.05)
    return network


@pytest.fixture(scope="module")
def checkpoint_folder(tmp_path_factory, source_network):
    """``checkpoints/carzero/`` as a user places it, with the tiny model."""
    folder = tmp_path_factory.mktemp("carzero")
    text = folder / "BioClinicalMPBERT"
    text.mkdir()
    (text / "vocab.txt").write_text("\n".join(VOCAB) + "\n")
    source_network.text_encoder.model.config.save_pretrained(text)
    write_authors_checkpoint(folder / "CARZero_best_model.ckpt", source_network)
    return folder


@pytest.fixture
def tiny(monkeypatch):
    monkeypatch.setattr(CARZero, "architecture", TINY)


def variant(folder, tmp_path, **kwargs):
    """A copy of ``folder`` whose checkpoint file is rewritten with ``kwargs``."""
    target = tmp_path / "variant"
    (target / "BioClinicalMPBERT").mkdir(parents=True)
    for name in ("vocab.txt", "config.json"):
        (target / "BioClinicalMPBERT" / name).write_bytes((folder / "BioClinicalMPBERT" / name).read_bytes())
    return target, kwargs


def built(folder, classes=("nodule", "mass")):
    model = CARZero(checkpoint_dir=str(folder))
    model.build(list(classes))
    return model


# -- checkpoint ---------------------------------------------------------------------------------


def test_full_size_network_has_the_authors_keys_and_shapes():
    with torch.device("meta"):
        network = CARZeroNetwork(BertModel(BertConfig(vocab_size=28996)), Architecture())
    expected = json.loads((REPO / "tests" / "carzero.keys.json").read_text())
    assert len(expected) == 434
    assert manifest(network.state_dict()) == expected
    assert network.fusion_module.decoder.norm is network.fusion_module.decoder_norm


def test_loads_the_authors_lightning_file(checkpoint_folder, source_network, tiny, no_network, recwarn):
    model = built(checkpoint_folder)
    loaded = model.network.state_dict()
    for key, value in source_network.state_dict().items():
        assert torch.equal(loaded[key], value), key
    assert not [w for w in recwarn if "hyper_parameters" in str(w.message) or "[UNK]" in str(w.message)]
    assert model.prompts == ["There is Lung Nodule", "There is Pulmonary Mass"]


def test_reads_the_config_out_of_the_inert_dictconfig(checkpoint_folder):
    loaded = safe_load(checkpoint_folder / "CARZero_best_model.ckpt")
    assert type(loaded["hyper_parameters"]).__name__ == "DictConfig"
    assert loaded["hyper_parameters"].args == ()  # built by NEWOBJ (cls.__new__ alone), state set after
    assert loaded["hparams_type"].qualified_name == "omegaconf.dictconfig.DictConfig"
    assert omegaconf_values(loaded["hyper_parameters"]) == authors_config(TINY)
    assert {cls.qualified_name for cls in loaded["callbacks"]} == {
        "pytorch_lightning.callbacks.model_checkpoint.ModelCheckpoint",
        "pytorch_lightning.callbacks.early_stopping.EarlyStopping",
    }
    assert loaded["optimizer_states"][0]["state"][0]["exp_avg"].abs().sum() > 0


def test_old_transformers_position_ids_is_the_one_declared_drop(checkpoint_folder, source_network, tmp_path, tiny):
    folder, _ = variant(checkpoint_folder, tmp_path)
    position_ids = {"CARZero.text_encoder.model.embeddings.position_ids": torch.arange(128)[None]}
    write_authors_checkpoint(folder / "CARZero_best_model.ckpt", source_network, edit=lambda s: s.update(position_ids))
    built(folder)
    other = {"CARZero.text_encoder.model.embeddings.token_type_ids": torch.zeros(1, 128, dtype=torch.long)}
    write_authors_checkpoint(folder / "CARZero_best_model.ckpt", source_network, edit=lambda s: s.update(other))
    with pytest.raises(CheckpointMismatchError, match=r"unexpected in the file \(1\): text_encoder\.model\.\{embeddings\.token_type_ids\}"):
        built(folder)


@pytest.mark.parametrize(
    "edit, error, pattern",
    [
        (lambda s: s.pop("CARZero.fusion_module.mlp_head.9.bias"), CheckpointMismatchError,
         r"missing in the file \(1\): fusion_module\.mlp_head\.\{9\.bias\}"),
        (lambda s: s.update({"CARZero.fusion_module.extra.weight": torch.zeros(1)}), CheckpointMismatchError,
         r"unexpected in the file \(1\): fusion_module\.extra\.\{weight\}"),
        (lambda s: s.update({"CARZero.img_encoder.model.pos_embed": torch.zeros(1, 50, 32)}), CheckpointMismatchError,
         r"shape of img_encoder\.model\.pos_embed: file \[1, 50, 32\] vs model \[1, 197, 32\]"),
        (lambda s: s.update({"module.CARZero.fusion_module.logit_scale": torch.zeros(())}), ValueError,
         r"keys without the expected prefix 'CARZero\.': module\.CARZero"),
        (lambda s: s["CARZero.fusion_module.decoder.norm.bias"].add_(1), ValueError,
         r"different values in the file: fusion_module\.decoder_norm\.bias vs fusion_module\.decoder\.norm\.bias"),
    ],
    ids=["missing", "extra", "reshaped", "prefix", "split-norm"],
)
def test_a_file_that_differs_fails_naming_the_key(checkpoint_folder, source_network, tmp_path, tiny, edit, error, pattern):
    folder, _ = variant(checkpoint_folder, tmp_path)
    write_authors_checkpoint(folder / "CARZero_best_model.ckpt", source_network, edit=edit)
    with pytest.raises(error, match=pattern):
        built(folder)


def test_config_values_are_checked_when_readable(checkpoint_folder, source_network, tmp_path, tiny):
    folder, _ = variant(checkpoint_folder, tmp_path)
    config = authors_config(TINY)
    config["model"]["text"]["last_n_layers"] = 3
    write_authors_checkpoint(folder / "CARZero_best_model.ckpt", source_network, config=config)
    with pytest.raises(ValueError, match=r"model\.text\.last_n_layers = 3, expected 4"):
        built(folder)
    del config["model"]["text"]["last_n_layers"]
    write_authors_checkpoint(folder / "CARZero_best_model.ckpt", source_network, config=config)
    with pytest.warns(UserWarning, match=r"hyper_parameters lack model\.text\.last_n_layers"):
        built(folder)
    write_authors_checkpoint(folder / "CARZero_best_model.ckpt", source_network,
                             hyper_parameters=argparse.Namespace(lr=1e-4))
    with pytest.warns(UserWarning, match="hyper_parameters not readable .*argparse.Namespace"):
        built(folder)


def test_missing_files_are_named(checkpoint_folder, tmp_path, tiny):
    with pytest.raises(FileNotFoundError, match="CARZero_best_model.ckpt not found in"):
        built(tmp_path)
    (tmp_path / "CARZero_best_model.ckpt").write_bytes((checkpoint_folder / "CARZero_best_model.ckpt").read_bytes())
    with pytest.raises(FileNotFoundError, match="BioClinicalMPBERT.* not found"):
        built(tmp_path)


# -- prompts and the text tower ------------------------------------------------------------------


def test_prompt_table_covers_every_paper_class():
    # spec carzero.md section 4.3, transcribed: official strings, then ours (the template)
    expected = {
        "pneumonia": "There is Pneumonia", "pneumothorax": "There is Pneumothorax", "covid19": "There is COVID-19",
        "atelectasis": "There is Atelectasis", "calcification": "There is Tissue Calcification",
        "consolidation": "There is Pulmonary Consolidation", "pleural_effusion": "There is Pleural Effusion",
        "emphysema": "There is Pulmonary Emphysema", "fibrosis": "There is Fibrosis",
        "fracture": "There is Bone Fracture", "mass": "There is Pulmonary Mass", "nodule": "There is Lung Nodule",
        "cardiomegaly": "There is Cardiomegaly", "infiltration": "There is Pulmonary Infiltration",
        "edema": "There is Pulmonary Edema", "lung_opacity": "There is Lung Opacity",
        "lung_lesion": "There is Abnormal Lesion", "enlarged_cardiomediastinum": "There is Enlarged Cardiomediastinum",
        "support_devices": "There is Support Devices", "pleural_other": "There is Pleural Other",
        "aortic_enlargement": "There is Aortic Enlargement", "clavicle_fracture": "There is Clavicle Fracture",
        "enlarged_pa": "There is Pulmonary Artery Enlargement",
        "interstitial_lung_disease": "There is Interstitial Lung Disease", "lung_cavity": "There is Cavitation",
        "lung_cyst": "There is Cyst", "mediastinal_shift": "There is Mediastinal Shift",
        "nodule_mass": "There is Nodule/Mass", "pleural_thickening": "There is Pleural Thickening",
        "pulmonary_fibrosis": "There is Pulmonary Fibrosis", "rib_fracture": "There is Rib Fracture",
        "other_lesion": "There is Other Lesion",
    }
    ours = {"covid19", "enlarged_cardiomediastinum", "support_devices", "pleural_other", "aortic_enlargement",
            "interstitial_lung_disease", "nodule_mass", "other_lesion"}
    pairs = [(dataset, key) for dataset, keys in PAPER_CLASSES.items() for key in keys]
    assert len(pairs) == 55
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        for dataset, key in pairs:
            assert prompt_for(key) == expected[key], (dataset, key)
            assert (key in TEMPLATE_CLASSES) == (key in ours) and (key in OFFICIAL_PROMPTS) != (key in ours), key
    with pytest.warns(UserWarning, match="no prompt for class 'tree_in_bud'"):
        assert prompt_for("tree_in_bud") == "There is tree in bud"


def test_text_cleaning_on_real_prompts():
    assert clean_text("There is Nodule/Mass") == "there is nodule mass"
    assert clean_text("There is COVID-19") == "there is covid 19"
    assert clean_text("There is Pleural Effusion") == "there is pleural effusion"
    # sentences split at "<digits>." and "."; one-word sentences dropped; non-ASCII letters dropped
    assert clean_text("1. There is X.\nCardiomegaly. no acute café disease") == "there is x no acute caf disease"


def test_word_pieces_merge_into_words_with_zero_slots_after_sep():
    tokens = [["[CLS]", "there", "is", "pneum", "##oth", "##orax", "[SEP]", "[PAD]", "[PAD]"],
              ["[CLS]", "lung", "nod", "##ule", "[SEP]", "[PAD]", "[PAD]", "[PAD]", "[PAD]"]]
    hidden = torch.randn(2, 9, 5)
    words = word_merge_matrix(tokens, slots=9) @ hidden
    h0, h1 = hidden
    expected0 = [h0[0], h0[1], h0[2], h0[3] + h0[4] + h0[5], h0[6]] + [torch.zeros(5)] * 4
    expected1 = [h1[0], h1[1], h1[2] + h1[3], h1[4]] + [torch.zeros(5)] * 5
    torch.testing.assert_close(words[0], torch.stack(expected0))
    torch.testing.assert_close(words[1], torch.stack(expected1))


def test_tokenizer_from_the_folder_knows_the_words(checkpoint_folder, no_network):
    tokenizer = load_tokenizer(checkpoint_folder / "BioClinicalMPBERT", "CARZero")
    ids = tokenizer("there is pneumothorax")["input_ids"]
    assert tokenizer.convert_ids_to_tokens(ids) == ["[CLS]", "there", "is", "pneum", "##oth", "##orax", "[SEP]"]


def test_prompt_vectors_follow_the_authors_text_tower(checkpoint_folder, source_network, tiny):
    model = built(checkpoint_folder, classes=("pneumothorax", "nodule"))
    bert = source_network.text_encoder.model
    # "there is pneumothorax" -> [CLS] there is pneum ##oth ##orax [SEP]; "there is lung nodule" -> ... nod ##ule
    ids = torch.zeros(2, 97, dtype=torch.long)
    ids[0, :7] = torch.tensor([2, 5, 6, 13, 14, 15, 3])
    ids[1, :7] = torch.tensor([2, 5, 6, 7, 8, 9, 3])
    with torch.no_grad():
        hidden = bert(input_ids=ids, attention_mask=(ids > 0).long(), output_hidden_states=True).hidden_states
    summed = hidden[-1] + hidden[-2] + hidden[-3] + hidden[-4]
    groups = [[[0], [1], [2], [3, 4, 5], [6]], [[0], [1], [2], [3], [4, 5], [6]]]
    for c, words in enumerate(groups):
        expected = torch.zeros(97, TINY.width)
        for slot, positions in enumerate(words):
            expected[slot] = summed[c, positions].sum(0)
        torch.testing.assert_close(model.words[c], expected, atol=1e-5, rtol=1e-5)
        assert model.words[c, len(words):].abs().sum() == 0
        torch.testing.assert_close(model.sentences[c], expected.sum(0) / 97, atol=1e-5, rtol=1e-5)


# -- fusion: scores and maps ---------------------------------------------------------------------


def reference_pass(fusion, memory, query):
    """One (memory, query) pair through the authors' decoder in plain tensor maths -> score, [layers, M]."""
    norm = fusion.decoder_norm
    memory = F.layer_norm(memory, memory.shape[-1:], norm.weight, norm.bias)
    x = F.layer_norm(query, query.shape[-1:], norm.weight, norm.bias)
    layers = []
    for layer in fusion.decoder.layers:
        attn = layer.multihead_attn
        width, heads = x.shape[-1], attn.num_heads
        w_q, w_k, w_v = attn.in_proj_weight.chunk(3)
        b_q, b_k, b_v = attn.in_proj_bias.chunk(3)
        q = F.layer_norm(x, (width,), layer.norm2.weight, layer.norm2.bias) @ w_q.T + b_q
        k, v = memory @ w_k.T + b_k, memory @ w_v.T + b_v
        head = width // heads
        weights = [torch.softmax(q[h * head:(h + 1) * head] @ k[:, h * head:(h + 1) * head].T / math.sqrt(head), -1)
                   for h in range(heads)]
        mixed = torch.cat([weights[h] @ v[:, h * head:(h + 1) * head] for h in range(heads)])
        x = x + mixed @ attn.out_proj.weight.T + attn.out_proj.bias
        hidden = torch.relu(F.layer_norm(x, (width,), layer.norm3.weight, layer.norm3.bias) @ layer.linear1.weight.T
                            + layer.linear1.bias)
        x = x + hidden @ layer.linear2.weight.T + layer.linear2.bias
        layers.append(torch.stack(weights).mean(0))
    x = F.layer_norm(x, x.shape[-1:], norm.weight, norm.bias)
    linears = [m for m in fusion.mlp_head if isinstance(m, torch.nn.Linear)]
    for linear in linears[:-1]:
        x = torch.relu(x @ linear.weight.T + linear.bias)
    return (x @ linears[-1].weight.T + linears[-1].bias)[0], torch.stack(layers)


def test_batched_scores_and_maps_equal_a_per_image_per_class_loop(source_network):
    torch.manual_seed(1)
    batch, classes, width = 3, 4, TINY.width
    image_global, patches = torch.randn(batch, width), torch.randn(batch, 196, width)
    sentences, words = torch.randn(classes, width), torch.randn(classes, 97, width)
    words[:, 60:] = 0  # empty slots after [SEP]
    with torch.no_grad():
        logits, maps = source_network.align(image_global, patches, sentences, words)
        assert logits.shape == (batch, classes) and maps.shape == (batch, classes, 196)
        fusion = source_network.fusion_module
        for b in range(batch):
            for c in range(classes):
                image_to_text, attention = reference_pass(fusion, torch.cat([image_global[b:b + 1], patches[b]]),
                                                          sentences[c])
                text_to_image, _ = reference_pass(fusion, torch.cat([sentences[c:c + 1], words[c]]), image_global[b])
                assert abs(float(logits[b, c]) - float(image_to_text + text_to_image) / 2) <= 1e-6
                torch.testing.assert_close(maps[b, c], attention.mean(0)[1:], atol=1e-6, rtol=0)


def test_map_is_the_layer_and_head_averaged_attention_without_the_global_column(source_network):
    captured = []
    hooks = [layer.multihead_attn.register_forward_hook(lambda m, i, out: captured.append(out[1]))
             for layer in source_network.fusion_module.decoder.layers]
    try:
        with torch.no_grad():
            _, maps = source_network.align(torch.randn(2, 32), torch.randn(2, 196, 32), torch.randn(3, 32),
                                           torch.randn(3, 97, 32))
    finally:
        for hook in hooks:
            hook.remove()
    image_to_text = [weights for weights in captured if weights.shape[-1] == 197]
    assert len(image_to_text) == TINY.fusion_layers and all(w.shape == (2, 3, 197) for w in image_to_text)
    torch.testing.assert_close(image_to_text[0].sum(-1), torch.ones(2, 3))  # rows are distributions
    expected = (image_to_text[0] + image_to_text[1] + image_to_text[2] + image_to_text[3])[..., 1:] / 4
    torch.testing.assert_close(maps, expected, atol=1e-7, rtol=1e-6)


# -- preprocessing and the frame --------------------------------------------------------------


def authors_input(pixels: np.ndarray) -> np.ndarray:
    """The authors' ``_resize_img`` on an 8-bit image (cv2, INTER_AREA, floor/ceil zero padding),
    ToTensor, CenterCrop(224), Normalize."""
    height, width = pixels.shape
    if height >= width:
        size = (256, int(float(width) * float(256 / float(height))))
    else:
        size = (int(float(height) * float(256 / float(width))), 256)
    resized = cv2.resize(pixels, size[::-1], interpolation=cv2.INTER_AREA)
    pad_h, pad_w = 256 - resized.shape[0], 256 - resized.shape[1]
    padded = np.pad(resized, [(pad_h // 2, math.ceil(pad_h / 2)), (pad_w // 2, math.ceil(pad_w / 2))])
    return (padded[16:240, 16:240].astype(np.float32) / 255 - np.float32(0.4978)) / np.float32(0.2449)


def native_window(image: np.ndarray, frame: int = 224) -> torch.Tensor:
    """CARZero's window on ``image``, in the image's own pixels (the frame is the image squashed to
    frame x frame): the geometry tests below work on the native grid."""
    height, width = image.shape
    _, window = CARZero.preprocess(image, frame)
    return window * torch.tensor([height / frame, width / frame, height / frame, width / frame])


@pytest.mark.parametrize("shape", [(224, 224), (150, 200), (300, 180), (1000, 800)])
def test_the_transform_is_the_authors_pipeline(shape):
    pixels = np.random.default_rng(0).integers(0, 256, shape).astype(np.uint8)
    inputs, _ = CARZero.preprocess(pixels.astype(np.float32) / 255, 224)
    assert inputs.shape == (3, 224, 224)
    expected = torch.from_numpy(authors_input(pixels))
    for channel in range(3):
        torch.testing.assert_close(inputs[channel], expected, atol=1e-6, rtol=0)


def test_a_256_image_is_only_cropped():
    _, window = CARZero.preprocess(np.zeros((256, 256), np.float32), 256)
    assert window.tolist() == [16.0, 16.0, 224.0, 224.0]


def test_area_resize_is_opencv_inter_area():
    image = np.random.default_rng(1).random((37, 53)).astype(np.float32)
    for height, width in [(256, 256), (17, 24), (101, 90)]:
        expected = cv2.resize(image, (width, height), interpolation=cv2.INTER_AREA)
        resized = area_resize(torch.from_numpy(image).double(), height, width)
        np.testing.assert_allclose(resized.numpy(), expected, atol=1e-6)


@pytest.mark.parametrize("mode", ["nearest", "bilinear"])
def test_square_image_map_fills_the_central_seven_eighths(mode):
    _, window = CARZero.preprocess(np.zeros((224, 224), np.float32), 224)
    assert window.tolist() == [14.0, 14.0, 196.0, 196.0]
    maps = torch.rand(2, 3, 14, 14)
    placed = place_in_frame(maps, window.expand(2, 4), (224, 224), mode)
    inner = F.interpolate(maps, size=(196, 196), mode=mode, **({"align_corners": False} if mode == "bilinear" else {}))
    torch.testing.assert_close(placed[..., 14:210, 14:210], inner)
    border = placed.clone()
    border[..., 14:210, 14:210] = float("nan")
    minimum = maps.amin(dim=(-2, -1))[..., None, None].expand_as(placed)
    assert torch.equal(border[~border.isnan()], minimum[~border.isnan()])


def cell_of_every_pixel(height, width):
    """For each pixel centre of a ``height x width`` image: its (row, column) cell in CARZero's crop, or -1.

    Forward through the authors' geometry: scale to the letterbox, add the padding, subtract the crop offset.
    """
    scale = 256 / max(height, width)
    rows_resized = 256 if height >= width else int(height * scale)
    cols_resized = 256 if width > height else int(width * scale)
    top, left = (256 - rows_resized) // 2, (256 - cols_resized) // 2
    y = (np.arange(height) + 0.5) * rows_resized / height + top - 16
    x = (np.arange(width) + 0.5) * cols_resized / width + left - 16
    row = np.where((y >= 0) & (y < 224), np.floor(y / 16), -1).astype(int)
    col = np.where((x >= 0) & (x < 224), np.floor(x / 16), -1).astype(int)
    return row, col


@pytest.mark.parametrize(
    "shape, cells",
    [((120, 200), [(6, 0), (2, 13), (11, 7)]),  # wide: crop cuts left/right; image rows fill cells 2..11
     ((200, 130), [(0, 6), (13, 12), (7, 1)])],  # tall: crop cuts top/bottom; image columns fill cells 1..12
)
def test_one_cell_lands_on_its_region_of_a_non_square_image(shape, cells):
    height, width = shape
    window = native_window(np.zeros(shape, np.float32))[None]
    row, col = cell_of_every_pixel(height, width)
    for cell in cells:
        maps = torch.zeros(1, 1, 14, 14)
        maps[0, 0, cell[0], cell[1]] = 1
        placed = place_in_frame(maps, window, shape, "nearest")[0, 0].numpy()
        expected = (row[:, None] == cell[0]) & (col[None, :] == cell[1])
        assert expected.any()
        np.testing.assert_array_equal(placed == 1, expected)
        peak = place_in_frame(maps, window, shape, "bilinear")[0, 0].numpy()
        assert expected[peak == peak.max()].all()
    seen = (row[:, None] >= 0) & (col[None, :] >= 0)
    assert not seen.all(), "the crop cuts a border of these images"
    maps = torch.rand(1, 1, 14, 14) + 1
    placed = place_in_frame(maps, window, shape, "bilinear")[0, 0].numpy()
    assert np.all(placed[~seen] == float(maps.min())) and np.all(placed[seen] >= float(maps.min()))


def test_a_lesion_near_the_border_comes_back_where_it_was():
    """A bright square near the left edge of a wide image: find it in CARZero's input, light
    the cells it falls in, place that map back: it covers the lesion in the original frame."""
    height, width = 160, 300
    image = np.full((height, width), 0.2, np.float32)
    image[70:90, 25:45] = 1.0  # inside the crop, which starts at x = 18.75 for this image
    image[20:30, 2:12] = 1.0  # in the strip the crop cuts away
    inputs, _ = CARZero.preprocess(image, 224)
    window = native_window(image)[None]
    bright = inputs[0] > (0.9 - 0.4978) / 0.2449
    cells = torch.zeros(14, 14)
    for y, x in bright.nonzero().tolist():
        cells[y // 16, x // 16] = 1
    assert 0 < cells.sum() <= 6 and cells[:, 0].any()
    placed = place_in_frame(cells[None, None], window, (height, width), "nearest")[0, 0]
    assert placed[70:90, 25:45].all(), "the lesion lies under the lit cells"
    assert not placed[20:30, 2:12].any(), "the cut-away lesion is in the unseen border"
    assert placed.sum() < placed.numel() / 20, "and little else"


def test_bf16_mixed_stays_close_to_fp32(checkpoint_folder, tiny):
    model = built(checkpoint_folder, ("nodule", "mass", "consolidation")).eval()
    assert_bf16_mixed_close_to_fp32(model, torch.rand(2, 3, 224, 224, generator=torch.Generator().manual_seed(0)))


# -- end to end ---------------------------------------------------------------------------------


def test_cli_grounds_ms_cxr_phrases(checkpoint_folder, tmp_path, tiny, no_network):
    from conftest import CHECK_ARGS, run_on_ms_cxr

    run_on_ms_cxr("carzero", tmp_path, "phrase", "--model.checkpoint_dir", str(checkpoint_folder), *CHECK_ARGS)


def test_cli_runs_carzero_on_the_phantom(checkpoint_folder, phantom_root, tmp_path, tiny, no_network):
    """With CARZero's CAM explainer of ``conftest.CLI_EXPLAINERS`` and both checks."""
    from conftest import check_explanation_sections, explainer_args, only_folder

    results = main(run_args("carzero", "phantom", phantom_root, tmp_path / "results", *explainer_args("carzero"),
                            "--model.checkpoint_dir", str(checkpoint_folder), "--data.batch_size", "4"))
    check_explanation_sections(results, only_folder(tmp_path / "results"))
    assert results["model"] == "carzero+hirescam" and results["data"]["images_evaluated"] == 9
    assert results["config"]["model"]["class_path"] == "xbench.models.carzero.CARZero"
    graded = sum(v["pairs"] for v in results["grounding"]["per_class"].values())
    assert graded > 0 and 0 <= results["grounding"]["macro"]["dice@best"] <= 1
    (folder,) = (tmp_path / "results").iterdir()
    pairs = pd.read_csv(folder / "pairs.csv.gz")
    assert results["classification"]["calibrated_logits"] is False
    assert "not calibrated probabilities" in (folder / "summary.md").read_text()

    data = Phantom(root=str(phantom_root), image_size=64, batch_size=4, num_workers=0)
    data.setup("test")
    model = built(checkpoint_folder, data.classes).eval()
    data.set_model_transform(model.preprocess)
    with torch.no_grad():
        for batch in data.test_dataloader():
            logits, maps = model(batch["model_input"])
            assert maps.shape == (len(batch["index"]), len(data.classes), 14, 14)
            for i, index in enumerate(batch["index"].tolist()):
                for c, key in enumerate(data.classes):
                    row = pairs[(pairs["image_index"] == index) & (pairs["class"] == key)]
                    assert float(row["logit"].iloc[0]) == pytest.approx(float(logits[i, c]), abs=1e-5)


def test_checkpoint_is_read_once_for_every_class_set(checkpoint_folder, tiny, monkeypatch):
    """A second class set (a suite's next dataset) re-encodes the prompts, never re-reads the file."""
    import xbench.models.carzero as carzero_module

    reads = []
    real = carzero_module.load_checkpoint
    monkeypatch.setattr(carzero_module, "load_checkpoint", lambda *a, **k: reads.append(1) or real(*a, **k))
    model = built(checkpoint_folder, ("nodule", "mass"))
    model.build(["consolidation"])
    assert len(reads) == 1 and model.sentences.shape[0] == 1
