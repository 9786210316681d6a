"""KAD and DeViDe: files in the authors' (or the provisional) layout, query sets, cross-attention maps.

The checkpoint files are written (``xbench.models.random_weights``) from the key manifests and the
specs' description of the authors' modules (which tensors are one tensor under two names), not from
XBench's modules. The
text tower is a one-layer BERT of the real width, so the files stay small enough to write per
session; the full-size key sets are checked on the meta device.
"""

import copy
import json
from pathlib import Path

import pytest
import torch
from torch import nn
from transformers import BertConfig

from conftest import assert_bf16_mixed_close_to_fp32, run_args
from xbench.findings import PAPER_CLASSES
from xbench.models.checkpoints import CheckpointMismatchError, load_state_dict_strict
from xbench.models import random_weights
from xbench.models.devide import DeViDe, ViTTokens
from xbench.models.kad import KAD, PROPOSED_PROMPTS, query_set
from xbench.models.random_weights import write_med_kebert
from xbench.geometry.preprocess import Preprocess
from xbench.test import main

REPO = Path(__file__).resolve().parents[1]
MANIFESTS = REPO / "xbench" / "models" / "manifests"
POSITION_IDS = "text_encoder/bert_model.embeddings.position_ids"
MARKER = Path("/tmp/xbench-test-kad-unpickle-marker")


def _explode(payload):  # what a malicious pickle would call without the weights_only unpickler
    MARKER.write_text(payload)
    return payload


class Explosive:
    def __reduce__(self):
        return (_explode, ("ran code from a pickle",))


def authors_file(manifest: dict, config: BertConfig, seed: int, img_res: int | None) -> dict:
    """The authors' file with a trap in its training state: an object whose unpickling runs code."""
    saved = random_weights.authors_file(manifest, config, seed, img_res)
    saved["lr_scheduler"]["hook"] = Explosive()
    return saved


def fingerprints(saved: dict, sections: tuple[str, ...]) -> dict:
    """Two numbers per tensor, enough to tell the loaded values from any others."""
    return {
        f"{section}/{key}": (value.double().sum().item(), value.flatten()[:2].double().tolist())
        for section in sections
        for key, value in saved[section].items()
    }


def loaded_values(model) -> dict:
    return fingerprints({layout.section: module.state_dict() for module, layout in model.checkpoint_parts()},
                        ("image_encoder", "text_encoder", "model"))


@pytest.fixture(scope="session")
def kad_files(tmp_path_factory):
    """``checkpoints/kad`` with all three variants, and the values written in each."""
    root = tmp_path_factory.mktemp("kad")
    config = write_med_kebert(root / "Med-KEBERT", num_hidden_layers=1, intermediate_size=64)
    manifests = json.loads((MANIFESTS / "kad.keys.json").read_text())
    written = {}
    for seed, variant in enumerate((224, 512, 1024)):
        saved = authors_file(manifests[f"KAD_{variant}/best_valid.pt"], config, seed, img_res=variant)
        (root / f"KAD_{variant}").mkdir()
        torch.save(saved, root / f"KAD_{variant}" / "best_valid.pt")
        written[variant] = fingerprints(saved, ("image_encoder", "text_encoder", "model"))
    return root, written


@pytest.fixture(scope="module")
def kad224(kad_files):
    return KAD(checkpoint_dir=str(kad_files[0]), variant=224).eval()


def test_queries_follow_the_authors_sets_and_cover_every_paper_class(recwarn):
    cxr14, index = query_set(list(PAPER_CLASSES["chestxray14"]), "chestxray14")
    assert cxr14 == ["atelectasis", "cardiomegaly", "pleural effusion", "infiltration", "lung mass", "lung nodule",
                     "pneumonia", "pneumothorax", "consolidation", "edema", "emphysema", "fibrosis",
                     "pleural thicken", "hernia"]
    assert [cxr14[i] for i in index] == ["atelectasis", "cardiomegaly", "pleural effusion", "infiltration",
                                         "lung mass", "lung nodule", "pneumonia", "pneumothorax"]
    det10, index = query_set(["nodule", "pleural_effusion"], "chestx_det10")
    assert det10 == ["atelectasis", "calcification", "consolidation", "effusion", "emphysema", "fibrosis",
                     "fracture", "mass", "nodule", "pneumothorax"]
    assert index == [8, 3]
    vindr, index = query_set(list(PAPER_CLASSES["vindr"]), "vindr")
    assert index == list(range(21))
    expected = {"enlarged_pa": "pulmonary artery enlargement", "interstitial_lung_disease": "interstitial pattern",
                "lung_opacity": "opacity", "lung_cavity": "cavitation", "lung_cyst": "cyst",
                "pleural_thickening": "pleural thicken", "nodule_mass": "nodule", "other_lesion": "lesion"}
    for key, prompt in expected.items():
        assert vindr[PAPER_CLASSES["vindr"].index(key)] == prompt
    for dataset, classes in PAPER_CLASSES.items():
        prompts, index = query_set(list(classes), dataset)
        assert len(index) == len(classes) and all(prompts[i] for i in index)
    assert not recwarn.list, [str(w.message) for w in recwarn.list]


def test_queries_outside_the_tables_are_announced(monkeypatch):
    with pytest.warns(UserWarning, match=r"chestxray14 query set has no prompt for \['fracture'\]"):
        prompts, index = query_set(["fracture", "nodule"], "chestxray14")
    assert (prompts, index) == (["fracture", "lung nodule"], [0, 1])
    monkeypatch.delitem(PROPOSED_PROMPTS, "hernia")
    with pytest.warns(UserWarning, match=r"no prompt for \['hernia'\]: using the finding's name"):
        assert query_set(["edema", "hernia"], "vindr") == (["edema", "hernia"], [0, 1])
    with pytest.warns(UserWarning, match="'pleural_plaque' is not in xbench/findings.py"), \
            pytest.warns(UserWarning, match=r"no prompt for \['pleural_plaque'\]"):  # raised KeyError before
        assert query_set(["pleural_plaque"], None) == (["pleural plaque"], [0])


@pytest.mark.parametrize("variant", [224, 512, 1024])
def test_modules_match_the_authors_key_manifest(variant, tmp_path):
    write_med_kebert(tmp_path / "Med-KEBERT")  # the real Med-KEBERT sizes are BertConfig's defaults
    with torch.device("meta"):
        model = KAD(checkpoint_dir=str(tmp_path), variant=variant)
        model.build_text_tower()
    ours = {f"{layout.section}/{key}": list(value.shape)
            for module, layout in model.checkpoint_parts() for key, value in module.state_dict().items()}
    manifest = json.loads((MANIFESTS / "kad.keys.json").read_text())[f"KAD_{variant}/best_valid.pt"]
    assert manifest.keys() - ours.keys() == {POSITION_IDS}
    assert ours == {key: shape for key, shape in manifest.items() if key != POSITION_IDS}
    text_layout = dict((layout.section, layout) for _, layout in model.checkpoint_parts())["text_encoder"]
    assert [drop.key for drop in text_layout.drops] == [POSITION_IDS.split("/", 1)[1]]


@pytest.mark.parametrize("variant, stride", [(224, 16), (512, 32), (1024, 32)])
def test_authors_files_load_strictly_offline(variant, stride, kad_files, no_network):
    MARKER.unlink(missing_ok=True)
    root, written = kad_files
    model = KAD(checkpoint_dir=str(root), variant=variant).eval()
    model.build(["nodule", "mass"])
    assert loaded_values(model) == {k: v for k, v in written[variant].items() if k != POSITION_IDS}
    if variant == 224:  # the sanity check's cascade fits the network (the same layers at every variant)
        from conftest import check_layer_groups

        assert check_layer_groups(model)[0].name == "classifier head"
    assert not MARKER.exists(), "loading executed code from the pickle"
    # the map grid is the input over the trunk's stride: 14x14, 16x16, 32x32 at the variants' sizes
    tokens, grid = model.image_encoder(torch.zeros(1, 3, 128, 128))
    assert grid == (128 // stride, 128 // stride) and tokens.shape == (1, (128 // stride) ** 2, 768)
    # each variant's transform is the authors': PIL bicubic of the 8-bit image, squashed to its size
    assert model.preprocess == Preprocess(variant, "squash", interpolation="bicubic", library="pil",
                                          map_upsample="bilinear")
    if variant == 224:
        logits, maps = model(torch.rand(1, 3, 224, 224))
        assert logits.shape == (1, 2) and maps.shape == (1, 2, 14, 14)


def test_a_file_of_another_variant_is_named(kad_files, tmp_path):
    root, _ = kad_files
    (tmp_path / "Med-KEBERT").symlink_to(root / "Med-KEBERT")
    for file_variant, model_variant in ((512, 224), (1024, 512)):  # 512 and 1024 differ only in config
        (tmp_path / f"KAD_{model_variant}").mkdir()
        (tmp_path / f"KAD_{model_variant}" / "best_valid.pt").symlink_to(root / f"KAD_{file_variant}" / "best_valid.pt")
        model = KAD(checkpoint_dir=str(tmp_path), variant=model_variant)
        with pytest.raises(ValueError, match=f"KAD-{file_variant} checkpoint .* but the model is KAD-{model_variant}"):
            model.build(["nodule"])


@pytest.fixture(scope="module")
def broken_kad(kad_files, tmp_path_factory):
    """A KAD-224 file without its config, one tensor missing, one extra and one reshaped."""
    root, _ = kad_files
    config = BertConfig.from_pretrained(root / "Med-KEBERT")
    manifest = json.loads((MANIFESTS / "kad.keys.json").read_text())["KAD_224/best_valid.pt"]
    saved = authors_file(manifest, config, seed=9, img_res=None)
    del saved["image_encoder"]["res_l2.bias"]
    saved["text_encoder"]["extra.weight"] = torch.zeros(2)
    saved["model"]["mlp_head.0.weight"] = torch.zeros(3, 768)
    broken = tmp_path_factory.mktemp("broken")
    (broken / "Med-KEBERT").symlink_to(root / "Med-KEBERT")
    for variant in (224, 512):
        (broken / f"KAD_{variant}").mkdir()
    torch.save(saved, broken / "KAD_224" / "best_valid.pt")
    (broken / "KAD_512" / "best_valid.pt").symlink_to(broken / "KAD_224" / "best_valid.pt")
    return broken


def test_missing_extra_and_reshaped_keys_are_named_by_section(broken_kad):
    with pytest.raises(CheckpointMismatchError) as caught:
        KAD(checkpoint_dir=str(broken_kad), variant=224).build(["nodule"])
    message = str(caught.value)
    assert "missing in the file (1): image_encoder/res_l2.bias" in message
    assert "unexpected in the file (1): text_encoder/extra.weight" in message
    assert "shape of model/mlp_head.0.weight: file [3, 768] vs model [2, 768]" in message
    assert caught.value.missing == ["image_encoder/res_l2.bias"]


def test_a_224_file_without_config_is_named_by_its_projector(broken_kad):
    with pytest.raises(ValueError, match="1024-wide projector res_l1, the layout of KAD-224, but the model is KAD-512"):
        KAD(checkpoint_dir=str(broken_kad), variant=512).build(["nodule"])


def test_two_names_of_one_tensor_must_agree(tmp_path):
    class Twice(nn.Module):
        def __init__(self):
            super().__init__()
            self.resnet = nn.Linear(2, 2)
            self.res_features = nn.Sequential(self.resnet)

    state = {k: v.clone() for k, v in Twice().state_dict().items()}
    load_state_dict_strict(Twice(), state, file="same.pt")
    state["res_features.0.weight"] = state["resnet.weight"] + 1
    with pytest.raises(ValueError, match=r"different values in the file: resnet\.weight vs res_features\.0\.weight"):
        load_state_dict_strict(Twice(), state, file="differs.pt")


def test_queries_interact_so_the_set_is_fixed(kad224):
    images = torch.rand(2, 3, 224, 224, generator=torch.Generator().manual_seed(0))
    kad224.build(["nodule"])
    alone, _ = kad224(images)
    kad224.build(["nodule", "mass"])
    together, together_maps = kad224(images)
    assert (alone[:, 0] - together[:, 0]).abs().max() > 1e-5, "adding a query must change the others' scores"
    assert (together[0] - together[1]).abs().max() > 1e-4, "the scores must depend on the image"
    first, first_maps = kad224(images[:1])
    torch.testing.assert_close(first, together[:1], rtol=0, atol=1e-5)
    torch.testing.assert_close(first_maps, together_maps[:1], rtol=0, atol=1e-6)


def test_maps_and_scores_come_from_the_last_layer_over_the_authors_query_set(kad224):
    """ChestX-ray14: all 14 of the authors' queries are decoded; pneumothorax and atelectasis are
    their 8th and 1st. Map = the last layer's head-averaged cross-attention, row-major 14x14."""
    kad224.dataset_name = "chestxray14"
    kad224.build(["pneumothorax", "atelectasis"])
    kad224.dataset_name = None
    attention, scores = [], []
    decoder = kad224.query_decoder
    hooks = [decoder.decoder["layers"][-1].multihead_attn.register_forward_hook(
                 lambda module, args, output: attention.append(output[1])),
             decoder.mlp_head.register_forward_hook(lambda module, args, output: scores.append(output))]
    try:
        logits, maps = kad224(torch.rand(2, 3, 224, 224, generator=torch.Generator().manual_seed(1)))
    finally:
        for hook in hooks:
            hook.remove()
    (attention,), (scores,) = attention, scores
    assert attention.shape == (2, 14, 196) and scores.shape == (2, 14, 2)
    torch.testing.assert_close(attention.sum(-1), torch.ones(2, 14))
    pneumothorax, atelectasis = 7, 0
    expected = torch.stack([attention[:, pneumothorax], attention[:, atelectasis]], 1)
    for row in range(14):  # row-major: token row * 14 + col is map[row, col]
        for col in range(14):
            assert torch.equal(maps[:, :, row, col], expected[:, :, row * 14 + col])
    log_odds = torch.log_softmax(scores, -1)
    torch.testing.assert_close(logits, (log_odds[..., 1] - log_odds[..., 0])[:, [pneumothorax, atelectasis]])


def cli_args(model: str, checkpoint_dir: Path, data_root: Path, results: Path) -> list[str]:
    """The phantom run of ``model``, with its CAM explainer and both checks (``conftest.explainer_args``)."""
    from conftest import explainer_args

    return run_args(model, "phantom", data_root, results, "--model.checkpoint_dir", str(checkpoint_dir),
                    "--data.batch_size", "4", *explainer_args(model))


def test_kad_bf16_mixed_stays_close_to_fp32(kad224):
    """With a one-convolution trunk in place of the ResNet-50 (bf16 is emulated on this CPU, seconds per
    image); the projections, the prompt queries and the decoder stay full size."""
    model = copy.deepcopy(kad224)
    model.build(["nodule", "mass", "pneumothorax"])
    model.image_encoder.res_features = nn.Conv2d(3, 1024, kernel_size=16, stride=16)
    assert_bf16_mixed_close_to_fp32(model, torch.rand(1, 3, 224, 224, generator=torch.Generator().manual_seed(0)))


def test_kad_channels_last_converts_its_whole_trunk(kad224):
    model = copy.deepcopy(kad224)
    model.on_test_start()  # on a CPU the option changes nothing
    convolutions = [w for w in model.parameters() if w.ndim == 4]
    assert len(convolutions) == 53 and all(w.is_contiguous() for w in convolutions)
    model.use_channels_last()  # what on_test_start does on CUDA (outputs: test_medklip_mavl.py)
    assert all(w.is_contiguous(memory_format=torch.channels_last) for w in convolutions)


@pytest.mark.slow  # a full-size network through the CLI
def test_kad_grounds_ms_cxr_phrases_through_the_cli(kad_files, tmp_path, no_network):
    from conftest import run_on_ms_cxr

    run_on_ms_cxr("kad", tmp_path, "phrase", "--model.checkpoint_dir", str(kad_files[0]))


@pytest.mark.slow  # a full-size network through the CLI, its CAM explainer and checks
def test_kad_end_to_end_through_the_cli(kad_files, phantom_root, tmp_path, no_network):
    """The 64-px metric frame does not limit the model: it reads the 256-px native phantom at 224."""
    from conftest import check_explanation_sections, only_folder

    results = main(cli_args("kad", kad_files[0], phantom_root, tmp_path))
    assert results["model"] == "kad+xgradcam" and results["config"]["model"]["init_args"]["variant"] == 224
    check_explanation_sections(results, only_folder(tmp_path))
    assert results["preprocess"]["size"] == 224 and results["map_upsample"] == "bilinear"
    assert results["data"]["images_evaluated"] == 9
    graded = [v for v in results["grounding"]["per_class"].values() if v["pairs"]]
    assert graded and all(0 <= v["pointing_game"] <= 1 for v in graded)


# -- DeViDe ---------------------------------------------------------------------------------------

VIT_4X_NAMES = {  # transformers 4.x ViTModel, as devide.md lists them
    "embeddings.cls_token": [1, 1, 768], "embeddings.position_embeddings": [1, 197, 768],
    "embeddings.patch_embeddings.projection.weight": [768, 3, 16, 16],
    "embeddings.patch_embeddings.projection.bias": [768],
    "layernorm.weight": [768], "layernorm.bias": [768], "pooler.dense.weight": [768, 768], "pooler.dense.bias": [768],
}
for _layer in range(12):
    for _name, _shape in {"attention.attention.query": [768, 768], "attention.attention.key": [768, 768],
                          "attention.attention.value": [768, 768], "attention.output.dense": [768, 768],
                          "intermediate.dense": [3072, 768], "output.dense": [768, 3072],
                          "layernorm_before": [768], "layernorm_after": [768]}.items():
        VIT_4X_NAMES[f"encoder.layer.{_layer}.{_name}.weight"] = _shape
        VIT_4X_NAMES[f"encoder.layer.{_layer}.{_name}.bias"] = [_shape[0]]


def test_vit_tower_has_4x_names_and_equals_transformers_vit():
    from transformers import ViTConfig, ViTModel

    with torch.device("meta"):
        names = {key: list(value.shape) for key, value in ViTTokens().state_dict().items()}
    assert names == {f"vit.{key}": shape for key, shape in VIT_4X_NAMES.items()}

    torch.manual_seed(0)
    ours = ViTTokens(depth=2).eval()
    for parameter in ours.parameters():
        parameter.data.normal_(0, 0.05)
    reference = ViTModel(ViTConfig(num_hidden_layers=2)).eval()  # transformers 5 names its weights anew
    renames = {"vit.": "", "encoder.layer.": "layers.", "attention.attention.query": "attention.q_proj",
               "attention.attention.key": "attention.k_proj", "attention.attention.value": "attention.v_proj",
               "attention.output.dense": "attention.o_proj", "intermediate.dense": "mlp.fc1", "output.dense": "mlp.fc2"}
    state = {}
    for key, value in ours.state_dict().items():
        for old, new in renames.items():
            key = key.replace(old, new)
        state[key] = value
    reference.load_state_dict(state, strict=True)
    images = torch.randn(2, 3, 224, 224)
    with torch.no_grad():
        tokens, grid = ours(images)
        expected = reference(pixel_values=images).last_hidden_state[:, 1:]
    assert grid == (14, 14)
    torch.testing.assert_close(tokens, expected, rtol=1e-5, atol=1e-5)


def test_devide_module_equals_its_provisional_manifest(tmp_path):
    write_med_kebert(tmp_path / "Med-KEBERT")
    with torch.device("meta"):
        model = DeViDe(checkpoint_dir=str(tmp_path))
        model.build_text_tower()
    ours = {f"{layout.section}/{key}": list(value.shape)
            for module, layout in model.checkpoint_parts() for key, value in module.state_dict().items()}
    manifest = json.loads((MANIFESTS / "devide.keys.json").read_text())
    assert ours == manifest["best_valid.pt"]
    kad = json.loads((MANIFESTS / "kad.keys.json").read_text())["KAD_224/best_valid.pt"]
    for section in ("text_encoder/", "model/"):  # KAD's text tower and decoder, unchanged
        assert {k: v for k, v in ours.items() if k.startswith(section)} == {
            k: v for k, v in kad.items() if k.startswith(section) and k != POSITION_IDS}


@pytest.fixture(scope="module")
def devide_dir(kad_files, tmp_path_factory):
    root, _ = kad_files
    folder = tmp_path_factory.mktemp("devide")
    (folder / "Med-KEBERT").symlink_to(root / "Med-KEBERT")
    config = BertConfig.from_pretrained(root / "Med-KEBERT")
    manifest = json.loads((MANIFESTS / "devide.keys.json").read_text())["best_valid.pt"]
    saved = authors_file(manifest, config, seed=5, img_res=224)
    torch.save(saved, folder / "best_valid.pt")
    return folder, fingerprints(saved, ("image_encoder", "text_encoder", "model"))


def test_devide_loads_a_file_in_its_provisional_layout(devide_dir, no_network):
    folder, written = devide_dir
    model = DeViDe(checkpoint_dir=str(folder)).eval()
    with pytest.warns(UserWarning, match="provisional"):
        model.build(["nodule", "mass", "consolidation"])
    assert loaded_values(model) == {k: v for k, v in written.items() if k != POSITION_IDS}
    from conftest import check_layer_groups

    assert [s.name for s in check_layer_groups(model)][:2] == ["classifier head", "query decoder: block 3"]
    logits, maps = model(torch.rand(1, 3, 224, 224))
    assert logits.shape == (1, 3) and maps.shape == (1, 3, 14, 14)
    torch.testing.assert_close(maps.sum((-2, -1)), torch.ones(1, 3))


def test_devide_names_the_difference_of_a_foreign_file(kad_files, tmp_path):
    root, _ = kad_files
    (tmp_path / "Med-KEBERT").symlink_to(root / "Med-KEBERT")
    (tmp_path / "best_valid.pt").symlink_to(root / "KAD_224" / "best_valid.pt")
    with pytest.raises(CheckpointMismatchError) as caught, pytest.warns(UserWarning, match="provisional"):
        DeViDe(checkpoint_dir=str(tmp_path)).build(["nodule"])
    message = str(caught.value)
    assert "missing in the file (200): image_encoder/vit.embeddings.{" in message
    assert "image_encoder/vit.encoder.{layer.0.attention.attention.key.bias" in message
    assert "unexpected in the file (582): image_encoder/res_features.0.{weight}" in message
    assert "image_encoder/resnet.layer1.{0.bn1.bias" in message
    assert "devide.keys.json" in message and "python -m xbench.inspect_checkpoint" in message
    assert len(caught.value.unexpected) == 582 and not caught.value.reshaped


def test_devide_bf16_mixed_stays_close_to_fp32(devide_dir):
    """With a one-block ViT in place of the twelve-block one (bf16 is emulated on this CPU)."""
    model = DeViDe(checkpoint_dir=str(devide_dir[0])).eval()
    with pytest.warns(UserWarning, match="provisional"):
        model.build(["nodule", "mass", "consolidation"])
    torch.manual_seed(0)
    model.image_encoder = ViTTokens(depth=1)
    for parameter in model.image_encoder.parameters():
        parameter.data.normal_(0, 0.05)
    assert_bf16_mixed_close_to_fp32(model, torch.rand(1, 3, 224, 224, generator=torch.Generator().manual_seed(0)))


@pytest.mark.slow  # a full-size network through the CLI
def test_devide_grounds_ms_cxr_phrases_through_the_cli(devide_dir, tmp_path, no_network):
    from conftest import run_on_ms_cxr

    with pytest.warns(UserWarning, match="provisional"):
        run_on_ms_cxr("devide", tmp_path, "phrase", "--model.checkpoint_dir", str(devide_dir[0]))


@pytest.mark.slow  # a full-size network through the CLI, its CAM explainer and checks
def test_devide_end_to_end_through_the_cli(devide_dir, phantom_root, tmp_path, no_network):
    from conftest import check_explanation_sections, only_folder

    with pytest.warns(UserWarning, match="provisional"):
        results = main(cli_args("devide", devide_dir[0], phantom_root, tmp_path))
    assert results["model"] == "devide+layercam" and results["data"]["images_evaluated"] == 9
    check_explanation_sections(results, only_folder(tmp_path))
