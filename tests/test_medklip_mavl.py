"""MedKLIP and MAVL: authors' checkpoint layouts, the full query book, the text cache, saliency, the CLI.

Everything runs on random weights: a full-size network per model (saved once per session in the
authors' layout) and a tiny BERT with hidden size 768 (what ``disease_embedding_layer`` takes)
whose vocabulary is generated from the description files the tests write.
"""

from __future__ import annotations

import copy
import json
import math
from pathlib import Path

import pytest
import torch
from transformers import BertModel, BertTokenizer

import xbench.models.text as text_module
from conftest import assert_bf16_mixed_close_to_fp32, assert_cam_declaration, run_args
from xbench.findings import OWN_FINDINGS, PAPER_CLASSES
from xbench.models.checkpoints import CheckpointMismatchError, extract_state_dict, load_state_dict_strict, manifest
from xbench.models.mavl import MAVL, AttentionPool2d, MAVLNet
from xbench.models.medklip import CLASS_ENTITIES, COVID_ENTITY, ENTITIES, MedKLIP, entity_book
from xbench.geometry.preprocess import equalize_histogram
from xbench.models.random_weights import (
    aspect_sentences,
    description,
    write_aspects,
    write_bert,
    write_descriptions,
    write_mavl,
    write_medklip,
)
from xbench.test import main

TESTS = Path(__file__).resolve().parent
MEAN, STD = (0.485, 0.456, 0.406), (0.229, 0.224, 0.225)
PNEUMONIA = 20  # the authors' index of "pneumonia" in the 75-entity book


@pytest.fixture(scope="module", autouse=True)
def text_cache(tmp_path_factory):
    """A cache of text embeddings private to this module (never the user's ~/.cache)."""
    with pytest.MonkeyPatch.context() as patch:
        folder = tmp_path_factory.mktemp("xbench-cache")
        patch.setenv("XBENCH_CACHE", str(folder))
        yield folder


@pytest.fixture(scope="module")
def bert_dir(tmp_path_factory) -> Path:
    folder = tmp_path_factory.mktemp("bert") / "Bio_ClinicalBERT"
    write_bert(folder)
    return folder


@pytest.fixture(scope="module")
def medklip_files(tmp_path_factory, bert_dir):
    folder = tmp_path_factory.mktemp("medklip")
    return folder, write_medklip(folder, bert_dir)


@pytest.fixture(scope="module")
def mavl_files(tmp_path_factory, bert_dir):
    folder = tmp_path_factory.mktemp("mavl")
    return folder, write_mavl(folder, bert_dir)


def authors_token_ids(bert: Path, texts: list[str]) -> torch.Tensor:
    """What the authors' ``tokenization_bert.py`` gives for single texts, written out by hand:
    ``[CLS]`` + the lower-cased word pieces (at most 63), no ``[SEP]``, zero-padded to 64."""
    tokenizer = BertTokenizer(vocab=str(bert / "vocab.txt"), do_lower_case=True)
    rows = []
    for text in texts:
        pieces = tokenizer.convert_tokens_to_ids(tokenizer.tokenize(text))[:63]
        rows.append([tokenizer.cls_token_id, *pieces] + [tokenizer.pad_token_id] * (63 - len(pieces)))
    return torch.tensor(rows)


def reference_embeddings(bert: Path, texts: list[str]) -> torch.Tensor:
    """[CLS] embeddings computed here with transformers directly from the authors' token ids."""
    ids = authors_token_ids(bert, texts)
    model = BertModel.from_pretrained(str(bert), local_files_only=True).eval()
    with torch.no_grad():
        return model(input_ids=ids, attention_mask=(ids != 0).long()).last_hidden_state[:, 0]


def pixels_of(image: torch.Tensor) -> torch.Tensor:
    """A 224x224 grey batch image as the model's input: 3 channels, ImageNet mean/std."""
    return torch.cat([(image - m) / s for m, s in zip(MEAN, STD)], dim=1)


def images() -> torch.Tensor:
    """One model input (CPU time: a ResNet-50 forward at 224x224 per image)."""
    return pixels_of(torch.rand(1, 1, 224, 224, generator=torch.Generator().manual_seed(7)))


def medklip_texts() -> list[str]:
    return [description(e) for e in ENTITIES]


def mavl_texts(entity: str) -> list[str]:
    """Slot 0 the description, slots 1-8 the aspects in file order."""
    return [description(entity), *aspect_sentences(entity)]


# -- class table ------------------------------------------------------------------------------------

def test_every_finding_has_entities_in_the_vocabulary():
    assert len(ENTITIES) == 75 == len(set(ENTITIES))
    assert OWN_FINDINGS <= set(CLASS_ENTITIES)
    assert {key for keys in PAPER_CLASSES.values() for key in keys} <= set(CLASS_ENTITIES)
    for entities in CLASS_ENTITIES.values():
        assert entities and set(entities) <= {*ENTITIES, COVID_ENTITY}


def test_book_is_always_the_full_vocabulary_with_covid_appended():
    book, index = entity_book(["nodule"])
    assert book == list(ENTITIES) and index == [[38]]
    book, index = entity_book(["pneumonia", "covid19", "nodule_mass", "fibrosis", "pleural_other"])
    assert book == [*ENTITIES, "covid19"]
    assert index == [[20], [75], [38, 54], [73], [16]]  # indices as printed in specs/models/medklip.md 4.2
    with pytest.raises(ValueError, match="no MedKLIP/MAVL entity for class.*'bronchiectasis'"):
        entity_book(["nodule", "bronchiectasis"])



# -- models built once per module, and one forward each with hooks ---------------------------------

CLASSES = ["pneumonia", "nodule_mass", "pleural_effusion"]
CLASS_ENTITY_INDEX = [[PNEUMONIA], [38, 54], [8]]


def forward_with_hooks(model, image: torch.Tensor) -> dict:
    """The model's outputs and, captured by hooks, what its parts computed on the way."""
    captured = {"attention": []}
    net = model.net
    hooks = [layer.multihead_attn.register_forward_hook(lambda m, a, out: captured["attention"].append(out[1]))
             for layer in net.decoder.layers]
    hooks.append(net.decoder.register_forward_hook(lambda m, a, out: captured.update(decoded=out[0])))
    hooks.append(net.classifier.register_forward_hook(lambda m, a, out: captured.update(two=out)))
    if isinstance(net, MAVLNet):
        hooks.append(net.pool.register_forward_hook(lambda m, a, out: captured.update(pooled=out)))
    with torch.no_grad():
        captured["logits"], captured["maps"] = model(image)
    for hook in hooks:
        hook.remove()
    return captured


@pytest.fixture(scope="module")
def medklip_model(medklip_files):
    model = MedKLIP(checkpoint_dir=str(medklip_files[0])).eval()
    model.build(CLASSES)
    return model


@pytest.fixture(scope="module")
def mavl_model(mavl_files):
    model = MAVL(checkpoint_dir=str(mavl_files[0])).eval()
    model.build(CLASSES)
    return model


@pytest.fixture(scope="module")
def medklip_run(medklip_model):
    return forward_with_hooks(medklip_model, images())


@pytest.fixture(scope="module")
def mavl_run(mavl_model):
    return forward_with_hooks(mavl_model, images())


# -- checkpoints ------------------------------------------------------------------------------------

@pytest.mark.parametrize("model, files, manifest_file", [
    ("medklip_model", "medklip_files", "medklip.keys.json"), ("mavl_model", "mavl_files", "mavl.keys.json")])
def test_authors_layout_loads_and_equals_the_manifest(model, files, manifest_file, request):
    model = request.getfixturevalue(model)
    _, saved = request.getfixturevalue(files)
    loaded = model.net.state_dict()
    dropped = {drop.key for drop in model.checkpoint_layout.drops}
    assert set(loaded) | dropped == set(saved) and not set(loaded) & dropped
    for key, value in loaded.items():
        assert torch.equal(value, saved[key]), key
    expected = json.loads((TESTS / manifest_file).read_text())
    assert {**manifest(loaded), **{k: list(saved[k].shape) for k in dropped}} == expected


@pytest.mark.parametrize("edit, error, pattern", [
    (lambda s: s.pop("module.decoder.layers.3.linear2.bias"), CheckpointMismatchError,
     r"missing in the file \(1\): decoder\.layers\.\{3\.linear2\.bias\}"),
    (lambda s: s.update({"module.decoder.extra.weight": torch.zeros(2)}), CheckpointMismatchError,
     r"unexpected in the file \(1\): decoder\.extra\.\{weight\}"),
    (lambda s: s.update({"module.classifier.weight": torch.zeros(3, 256)}), CheckpointMismatchError,
     r"shape of classifier\.weight: file \[3, 256\] vs model \[2, 256\]"),
    (lambda s: s.update({"module.cl_fc.weight": torch.zeros(768, 255)}), ValueError, r"declared drop cl_fc\.weight"),
    (lambda s: s.update({"res_l1.bias": s.pop("module.res_l1.bias")}), ValueError,
     r"without the expected prefix 'module\.': res_l1\.bias"),
], ids=["missing", "extra", "reshaped", "bad-drop", "no-prefix"])
def test_medklip_mismatch_names_the_key(medklip_files, medklip_model, edit, error, pattern):
    _, saved = medklip_files
    state = {f"module.{k}": v for k, v in saved.items()}
    edit(state)
    layout = MedKLIP.checkpoint_layout
    with pytest.raises(error, match=pattern):  # raised before any tensor is copied
        load_state_dict_strict(medklip_model.net, extract_state_dict({"model": state}, layout, "ckpt.pth"),
                               file="ckpt.pth", drops=layout.drops)


def test_mavl_temp_is_a_checked_drop_and_classifier_width_is_checked(mavl_files, mavl_model):
    _, saved = mavl_files
    layout = MAVL.checkpoint_layout
    for key, value, error, pattern in [
        ("temp", torch.zeros(8), ValueError, r"declared drop temp"),
        ("classifier.weight", torch.zeros(2, 256), CheckpointMismatchError,
         r"classifier\.weight: file \[2, 256\] vs model \[2, 2304\]"),
    ]:
        state = {f"module.{k}": v for k, v in {**saved, key: value}.items()}
        with pytest.raises(error, match=pattern):
            load_state_dict_strict(mavl_model.net, extract_state_dict({"model": state}, layout, "f"),
                                   file="f", drops=layout.drops)


def test_missing_files_and_keys_are_named(medklip_files, mavl_files, tmp_path):
    medklip_dir, _ = medklip_files
    mavl_dir, _ = mavl_files
    folder = tmp_path / "medklip"
    folder.mkdir()
    (folder / "checkpoint_final.pth").symlink_to(medklip_dir / "checkpoint_final.pth")
    with pytest.raises(FileNotFoundError, match="observation explanation.json not found in"):
        MedKLIP(checkpoint_dir=str(folder)).build(["mass"])
    write_descriptions(folder / "observation explanation.json", [e for e in ENTITIES if e != "hernia"], True)
    with pytest.raises(ValueError, match=r"observation explanation.json: no description for entity 'hernia'"):
        MedKLIP(checkpoint_dir=str(folder)).build(["mass"])  # hernia is not asked for, but the book needs it
    write_descriptions(folder / "observation explanation.json", ENTITIES, True)
    with pytest.raises(ValueError, match=r"no description for entity 'covid19'.*76-entry copy from the MAVL repository"):
        MedKLIP(checkpoint_dir=str(folder)).build(["covid19"])
    with pytest.raises(FileNotFoundError, match="Bio_ClinicalBERT not found"):
        MedKLIP(checkpoint_dir=str(folder)).build(["mass"])

    folder = tmp_path / "mavl"
    folder.mkdir()
    for name in ("checkpoint_full_40.pth", "observation explanation.json"):
        (folder / name).symlink_to(mavl_dir / name)
    with pytest.raises(FileNotFoundError, match="checkpoint_full_46.pth, gpt4_mimic.json not found in"):
        MAVL(checkpoint_dir=str(folder), checkpoint="checkpoint_full_46.pth").build(["nodule"])
    write_aspects(folder / "gpt4_mimic.json", ENTITIES)
    with pytest.raises(ValueError, match=r"gpt4_mimic.json: no aspect sentences for entity 'covid19'"):
        MAVL(checkpoint_dir=str(folder)).build(["covid19"])
    book = json.loads((folder / "gpt4_mimic.json").read_text())
    book["mass"] = book["mass"][1:] + book["mass"][:1]
    (folder / "gpt4_mimic.json").write_text(json.dumps(book))
    with pytest.raises(ValueError, match=r"sentences of 'mass' start with aspects \['fluid'"):
        MAVL(checkpoint_dir=str(folder)).build(["nodule"])


# -- the query book and the text step ---------------------------------------------------------------

@pytest.mark.parametrize("name", ["medklip", "mavl"])
def test_the_declared_cam_layer_is_on_the_scores_path(name, request):
    run = request.getfixturevalue(f"{name}_run")
    assert_cam_declaration(request.getfixturevalue(f"{name}_model"), images(), (run["logits"], run["maps"]))


def test_medklip_scores_with_the_full_book_and_the_subset_differs(medklip_model, medklip_run, bert_dir):
    full = reference_embeddings(bert_dir, medklip_texts())  # file order = entity order; "eumonia" is pneumonia
    torch.testing.assert_close(medklip_model.query_text, full, rtol=1e-4, atol=1e-5)
    with torch.no_grad():
        subset, _ = medklip_model.net(images(), full[[PNEUMONIA]])
    logit = medklip_run["logits"][:, 0]
    assert ((logit - (subset[:, 0, 1] - subset[:, 0, 0])).abs() > 1e-5).all()  # float32 noise is ~1e-7


def test_medklip_reads_the_mavl_description_file_with_covid(medklip_files, mavl_files, tmp_path):
    folder = tmp_path / "medklip"
    folder.mkdir()
    (folder / "observation explanation.json").symlink_to(mavl_files[0] / "observation explanation.json")
    book, index = entity_book(["covid19"])
    texts = MedKLIP(checkpoint_dir=str(folder)).query_texts(book)
    assert texts == [description(e) for e in (*ENTITIES, COVID_ENTITY)] and index == [[75]]


def test_mavl_scores_with_the_full_book_slot_major_and_the_subset_differs(mavl_model, mavl_run, bert_dir):
    assert mavl_model.query_text.shape == (75 * 9, 768)
    for disease in (0, 3, PNEUMONIA, 53, 74):  # rows d*9 + slot, checked on a few diseases (BERT is slow on CPU)
        expected = reference_embeddings(bert_dir, mavl_texts(ENTITIES[disease]))
        torch.testing.assert_close(mavl_model.query_text[disease * 9:(disease + 1) * 9], expected, rtol=1e-4, atol=1e-5)
    weight, bias = mavl_model.net.classifier.weight, mavl_model.net.classifier.bias
    for column, diseases in enumerate(CLASS_ENTITY_INDEX):
        scores = []
        for disease in diseases:
            slots = mavl_run["decoded"][:, disease * 9:(disease + 1) * 9]  # [B, 9, 256]
            two = torch.cat([slots[:, k] for k in range(9)], dim=1) @ weight.T + bias  # slot 0's values first
            scores.append(two[:, 1] - two[:, 0])
        torch.testing.assert_close(mavl_run["logits"][:, column], torch.stack(scores).amax(0), rtol=1e-4, atol=1e-5)
    with torch.no_grad():
        subset, _, _ = mavl_model.net(images(), mavl_model.query_text[PNEUMONIA * 9:(PNEUMONIA + 1) * 9])
    assert ((mavl_run["logits"][:, 0] - (subset[:, 0, 1] - subset[:, 0, 0])).abs() > 1e-5).all()


def test_text_embeddings_are_cached_and_keyed_by_weights_and_texts(bert_dir, tmp_path, monkeypatch):
    monkeypatch.setenv("XBENCH_CACHE", str(tmp_path / "cache"))
    built = []
    real_loader = text_module.load_pretrained_bert
    monkeypatch.setattr(text_module, "load_pretrained_bert", lambda *a, **k: built.append(1) or real_loader(*a, **k))
    texts = ["The nodule finding.", "The mass finding."]
    first = text_module.bert_cls_embeddings(bert_dir, texts, "test BERT")
    assert len(built) == 1
    torch.testing.assert_close(first, reference_embeddings(bert_dir, texts), rtol=1e-4, atol=1e-5)
    second = text_module.bert_cls_embeddings(bert_dir, texts, "test BERT")
    assert len(built) == 1, "the second run built the BERT instead of reading the cache"
    assert torch.equal(first, second)

    text_module.bert_cls_embeddings(bert_dir, texts[:1], "test BERT")
    assert len(built) == 2, "other texts must not hit the cache"
    other = tmp_path / "other-bert"
    write_bert(other, seed=5)
    changed = text_module.bert_cls_embeddings(other, texts, "test BERT")
    assert len(built) == 3 and not torch.allclose(changed, first), "other weights must not hit the cache"


def test_model_setup_reads_the_cache_without_building_bert(medklip_model, monkeypatch):
    def forbidden(*args, **kwargs):
        raise AssertionError("BERT was built although its embeddings are cached")

    monkeypatch.setattr(text_module, "load_pretrained_bert", forbidden)
    second = MedKLIP(checkpoint_dir=str(medklip_model.checkpoint_dir))
    second.build(["mass", "nodule"])  # other classes, the same book: cached by the module's first build
    assert torch.equal(second.query_text, medklip_model.query_text)


def test_tokens_are_the_authors_cls_and_pieces_without_sep(bert_dir):
    """A long text keeps 63 pieces after [CLS] and no [SEP]; a short one is padded after its pieces."""
    tokenizer = text_module.load_tokenizer(bert_dir, "test BERT", do_lower_case=True)
    texts = ["the nodule finding", " ".join(["opacity"] * 80)]
    tokens = text_module.cls_only_tokens(tokenizer, texts, 64)
    assert torch.equal(tokens["input_ids"], authors_token_ids(bert_dir, texts))
    assert tokenizer.sep_token_id not in tokens["input_ids"].tolist()[1]
    assert tokens["attention_mask"][1].all() and tokens["attention_mask"][0].sum() == 1 + len(tokenizer.tokenize(texts[0]))


def test_tokens_are_lower_cased(bert_dir):
    lower, upper = text_module.bert_cls_embeddings(bert_dir, ["the nodule finding", "The NODULE Finding"], "test BERT")
    torch.testing.assert_close(lower, upper, rtol=0, atol=1e-6)
    cased = text_module.bert_cls_embeddings(bert_dir, ["The NODULE Finding"], "test BERT", lowercase=False)
    assert not torch.allclose(cased[0], lower)


# -- saliency and scores ----------------------------------------------------------------------------

@pytest.mark.parametrize("run", ["medklip_run", "mavl_run"])
def test_maps_are_the_hooked_cross_attention_and_logits_the_best_entity(run, request):
    run = request.getfixturevalue(run)
    batch = run["logits"].shape[0]
    assert len(run["attention"]) == 4 and run["maps"].shape == (batch, 3, 14, 14)
    layer_mean = sum(run["attention"]) / 4  # [B, Q, 196], each already averaged over heads
    if layer_mean.shape[1] == 75 * 9:  # MAVL: description, patterns, shape, texture slots
        layer_mean = layer_mean.view(batch, 75, 9, 196)[:, :, [0, 6, 7, 8]].mean(2)
    entity_logits = run["two"][..., 1] - run["two"][..., 0]
    for column, entities in enumerate(CLASS_ENTITY_INDEX):
        expected = sum(layer_mean[:, e] for e in entities) / len(entities)
        torch.testing.assert_close(run["maps"][:, column], expected.view(batch, 14, 14), rtol=1e-5, atol=1e-7)
        best = torch.stack([entity_logits[:, e] for e in entities]).amax(0)
        torch.testing.assert_close(run["logits"][:, column], best, rtol=1e-5, atol=1e-6)
    row, column = 3, 11  # row-major: token 3 * 14 + 11
    torch.testing.assert_close(run["maps"][:, 0, row, column], layer_mean[:, PNEUMONIA, row * 14 + column])


def test_mavl_text_scoring_from_the_pooled_image(mavl_model, mavl_run):
    mavl_model.scoring = "text"
    try:
        with torch.no_grad():
            logits, maps = mavl_model(images())
            queries = mavl_model.net.disease_embedding_layer(mavl_model.query_text)
    finally:
        mavl_model.scoring = "feature"
    torch.testing.assert_close(maps, mavl_run["maps"])
    pooled = mavl_run["pooled"][0]
    cosine = lambda d, slot: torch.cosine_similarity(pooled, queries[d * 9 + slot], dim=0)  # noqa: E731
    for column, disease in ((0, PNEUMONIA), (2, 8)):  # pneumonia, pleural effusion
        probabilities = []
        for slot in range(9):
            for reference in (0, 1):  # normal, clear
                pair = torch.softmax(torch.stack([cosine(reference, slot), cosine(disease, slot)]), dim=0)
                probabilities.append(pair[1])
        p = torch.stack(probabilities).mean().item()
        assert logits[0, column].item() == pytest.approx(math.log(p / (1 - p)), abs=1e-5)
    with pytest.raises(ValueError, match="224x224 input"):
        AttentionPool2d()(torch.zeros(1, 1024, 16, 16))


def test_histogram_equalisation_matches_skimage_recipe_and_is_an_option():
    import numpy as np

    image = torch.rand(1, 1, 224, 224, generator=torch.Generator().manual_seed(7)) ** 2
    out = equalize_histogram(image)
    pixels = image[0, 0].double().numpy()  # skimage.exposure.equalize_hist: 256 bins over [min, max], cdf at centres
    counts, edges = np.histogram(pixels, bins=256, range=(pixels.min(), pixels.max()))
    expected = np.interp(pixels.ravel(), (edges[:-1] + edges[1:]) / 2, counts.cumsum() / counts.sum())
    np.testing.assert_allclose(out[0, 0].numpy().ravel(), expected, atol=1e-6)
    assert torch.equal(equalize_histogram(torch.full((1, 1, 4, 4), 0.3)), torch.full((1, 1, 4, 4), 0.3))

    # the option is the authors' RSNA step, stated in the model's transform (run on the native image)
    assert MedKLIP(equalize_histogram=True).preprocess.equalize and not MedKLIP().preprocess.equalize
    assert MAVL(equalize_histogram=True).preprocess.equalize


# -- end to end -------------------------------------------------------------------------------------

@pytest.mark.slow  # a full-size network through the CLI, its CAM explainer and checks
@pytest.mark.parametrize("model, files, class_path", [
    ("medklip", "medklip_files", "xbench.models.medklip.MedKLIP"), ("mavl", "mavl_files", "xbench.models.mavl.MAVL")])
def test_end_to_end_through_the_cli(model, files, class_path, request, tmp_path, no_network):
    """4 phantom images (seed 2: all three lesion kinds), since every image costs a ResNet-50 at 224x224;
    the maps from the model's CAM explainer of ``conftest.CLI_EXPLAINERS``, with both checks."""
    from conftest import CLI_EXPLAINERS, check_explanation_sections, explainer_args

    folder, _ = request.getfixturevalue(files)
    results = main(run_args(
        model, "phantom", tmp_path / "phantom", tmp_path / "results", "--model.checkpoint_dir", str(folder),
        "--data.num_images", "4", "--data.native_size", "64", "--data.seed", "2", "--data.batch_size", "3",
        *explainer_args(model), image_size=None,
    ))
    (run,) = (tmp_path / "results").iterdir()
    assert run.name.startswith(f"{model}+{CLI_EXPLAINERS[model]}__phantom__") and (run / "metrics.json").is_file()
    assert results["data"]["images_evaluated"] == 4 and results["explainer"]["name"] == CLI_EXPLAINERS[model]
    check_explanation_sections(results, run)
    assert results["config"]["model"]["class_path"] == class_path
    graded = [values for values in results["grounding"]["per_class"].values() if values["pairs"]]
    assert len(graded) == 3 and all(0 <= v["dice@best"] <= 1 and 0 <= v["pointing_game"] <= 1 for v in graded)


@pytest.mark.parametrize("fixture", ["medklip_model", "mavl_model"])
def test_layer_groups_fit_the_network(fixture, request):
    """The sanity check's cascade on the full-size network: classifier first, the ResNet's stem last."""
    from conftest import check_layer_groups

    steps = check_layer_groups(request.getfixturevalue(fixture))
    assert steps[0].name == "classifier" and steps[-1].name == "image tower: stem"


@pytest.mark.slow  # a full-size network through the CLI and the checks
@pytest.mark.parametrize("model, files", [("medklip", "medklip_files"), ("mavl", "mavl_files")])
def test_ms_cxr_queries_are_grounded_by_their_finding(model, files, request, tmp_path, no_network):
    """A fixed vocabulary: each report phrase is grounded by its finding's map, and the results say so;
    MedKLIP's run also takes both checks on the native maps of this real-format fixture (the checks of
    a query slot grounded by its finding: ``conftest.CHECK_ARGS``)."""
    from conftest import CHECK_ARGS, run_on_ms_cxr

    folder, _ = request.getfixturevalue(files)
    run_on_ms_cxr(model, tmp_path, "finding", "--model.checkpoint_dir", str(folder),
                  *(CHECK_ARGS if model == "medklip" else ()))


# -- the GPU path: bf16 and channels-last -------------------------------------------------------------

def with_small_trunk(model):
    """A copy of ``model`` whose ResNet is one stride-16 convolution to 1024 channels: the rest
    (projections, the decoder over the whole query book, heads) stays full size. bf16 on a CPU
    without bf16 instructions is emulated, and a ResNet-50 in it takes seconds per image."""
    model = copy.deepcopy(model)
    trunk = "res_features" if hasattr(model.net, "res_features") else "backbone"
    with torch.random.fork_rng():
        torch.manual_seed(0)  # the same trunk whatever ran before: the tolerance is checked on fixed weights
        setattr(model.net, trunk, torch.nn.Conv2d(3, 1024, kernel_size=16, stride=16))
    return model


@pytest.mark.parametrize("model", ["medklip_model", "mavl_model"])
def test_bf16_mixed_stays_close_to_fp32(model, request):
    assert_bf16_mixed_close_to_fp32(with_small_trunk(request.getfixturevalue(model)), images())


def test_channels_last_leaves_the_outputs_unchanged(medklip_model):
    model = copy.deepcopy(medklip_model)
    stem = next(m for m in model.net.modules() if isinstance(m, torch.nn.Conv2d))
    assert stem.weight.shape == (64, 3, 7, 7)
    model.on_test_start()  # what a run does first: on a CPU the option changes nothing
    assert stem.weight.is_contiguous()
    with torch.no_grad():
        expected = model(images())
        model.use_channels_last()  # what on_test_start does on CUDA, forced here
        assert all(w.is_contiguous(memory_format=torch.channels_last) for w in model.parameters() if w.ndim == 4)
        assert not stem.weight.is_contiguous()
        outputs = model(images())
    for got, want in zip(outputs, expected):
        torch.testing.assert_close(got, want, rtol=1e-5, atol=1e-6)


@pytest.mark.parametrize("model", ["medklip_model", "mavl_model"])
def test_checkpoint_is_read_once_for_every_class_set(model, request, monkeypatch):
    """A second class set picks other rows of the same book; the network is not loaded again."""
    import xbench.models.medklip as medklip_module

    built = request.getfixturevalue(model)
    monkeypatch.setattr(medklip_module, "load_checkpoint", lambda *a, **k: pytest.fail("the checkpoint was read again"))
    net = built.net
    try:
        built.build(["nodule"])
        assert built.net is net and built.entity_index.shape[0] == 1
    finally:
        built.build(CLASSES)
