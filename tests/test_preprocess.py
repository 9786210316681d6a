"""Preprocess: each resize rule against torchvision/PIL/OpenCV run directly on real radiographs of
different aspect (exact tensors), windows against the geometry by hand, and the model input through
the datamodule and a DataLoader."""


import cv2
import numpy as np
import pytest
import torch
from PIL import Image
from torchvision import transforms as T

from conftest import real_file
from xbench.data.io import read_image
from xbench.data.phantom import Phantom
from xbench.geometry.preprocess import (
    CXR_MAE_MEAN, CXR_MAE_STD, IMAGENET_MEAN, IMAGENET_STD, OPENAI_CLIP_MEAN, OPENAI_CLIP_STD, Preprocess, area_resize,
    equalize_histogram,
)

#: a square 8-bit PNG (512 x 512), a near-square JPEG (2021 wide, 2022 high), a wide JPEG (2828 x 2320)
IMAGES = (
    "nih/00000001_000.png",
    "chexlocalize/valid/patient64542/study1/view1_frontal.jpg",
    "chexlocalize/valid/patient64541/study1/view1_frontal.jpg",
)
BICUBIC = T.InterpolationMode.BICUBIC

@pytest.fixture(scope="module", params=IMAGES)
def radiograph(request, real_data):
    path = real_file(real_data, request.param)
    return path, read_image(path)

def authors_rgb(path):
    return Image.open(path).convert("RGB")

def test_eight_bits_recovered_exactly(radiograph):
    path, image = radiograph
    np.testing.assert_array_equal(np.round(image * 255).astype(np.uint8), np.asarray(Image.open(path)))

@pytest.mark.parametrize(
    "preprocess, reference",
    [
        # MedKLIP/MAVL: Resize([224, 224]) (PIL bilinear), ImageNet statistics
        (Preprocess(224), T.Compose([T.Resize([224, 224]), T.ToTensor(), T.Normalize(IMAGENET_MEAN, IMAGENET_STD)])),
        # KAD-512: bicubic squash
        (
            Preprocess(512, interpolation="bicubic"),
            T.Compose(
                [T.Resize([512, 512], interpolation=BICUBIC), T.ToTensor(), T.Normalize(IMAGENET_MEAN, IMAGENET_STD)]
            ),
        ),
        # open_clip: the shorter side to 224, centre crop
        (
            Preprocess(224, resize="shorter_side", interpolation="bicubic", mean=OPENAI_CLIP_MEAN, std=OPENAI_CLIP_STD),
            T.Compose(
                [
                    T.Resize(224, interpolation=BICUBIC),
                    T.CenterCrop(224),
                    T.ToTensor(),
                    T.Normalize(OPENAI_CLIP_MEAN, OPENAI_CLIP_STD),
                ]
            ),
        ),
        # the shorter side to 256, then a real centre crop (torchvision's rounded offsets)
        (
            Preprocess(224, resize="shorter_side", resize_to=256, interpolation="bilinear"),
            T.Compose([T.Resize(256), T.CenterCrop(224), T.ToTensor(), T.Normalize(IMAGENET_MEAN, IMAGENET_STD)]),
        ),
    ],
    ids=["squash-bilinear-224", "squash-bicubic-512", "shorter-side-224", "shorter-side-256-crop-224"],
)
def test_pil_pipelines_equal_torchvision(radiograph, preprocess, reference):
    path, image = radiograph
    inputs, _ = preprocess(image, 224)
    assert inputs.dtype == torch.float32 and inputs.shape == (3, preprocess.size, preprocess.size)
    assert torch.equal(inputs, reference(authors_rgb(path)))

def carzero_reference(path):
    """CARZero's process_img as spec'd (specs/models/carzero.md 2.1), written here with OpenCV."""
    grey = cv2.imread(str(path), cv2.IMREAD_GRAYSCALE)
    height, width = grey.shape
    if height >= width:
        shape = (256, int(float(width) * (256 / float(height))))
    else:
        shape = (int(float(height) * (256 / float(width))), 256)
    resized = cv2.resize(grey, shape[::-1], interpolation=cv2.INTER_AREA)
    top, left = (256 - shape[0]) // 2, (256 - shape[1]) // 2
    padded = np.pad(resized, ((top, 256 - shape[0] - top), (left, 256 - shape[1] - left)))
    rgb = Image.fromarray(padded).convert("RGB")
    return T.Compose([T.CenterCrop(224), T.ToTensor(), T.Normalize(CXR_MAE_MEAN, CXR_MAE_STD)])(rgb), shape

CARZERO = Preprocess(
    224, resize="longer_side", resize_to=256, interpolation="area", library="cv2", mean=CXR_MAE_MEAN, std=CXR_MAE_STD
)

def test_cv2_letterbox_equals_carzero(radiograph):
    path, image = radiograph
    reference, shape = carzero_reference(path)
    assert CARZERO.resized_shape(*image.shape) == shape
    inputs, window = CARZERO(image, 224)
    assert torch.equal(inputs, reference)
    top, left = (256 - shape[0]) // 2, (256 - shape[1]) // 2
    expected = [(16 - top) * 224 / shape[0], (16 - left) * 224 / shape[1], 224 * 224 / shape[0], 224 * 224 / shape[1]]
    torch.testing.assert_close(window, torch.tensor(expected, dtype=torch.float32))

def test_exact_area_weights_are_not_opencv():
    """Why OpenCV is a runtime dependency: exact area weights with round-half-even differ from
    INTER_AREA's integer fast path (a 2x shrink) by one level in many pixels."""
    rng = np.random.default_rng(0)
    pixels = rng.integers(0, 256, (64, 64), dtype=np.uint8)
    ours = torch.round(area_resize(torch.from_numpy(pixels.astype(np.float64)), 32, 32)).numpy()
    opencv = cv2.resize(pixels, (32, 32), interpolation=cv2.INTER_AREA)
    difference = np.abs(ours - opencv)
    assert difference.max() == 1 and (difference > 0).sum() > 10

def test_windows_by_hand():
    wide = np.zeros((2320, 2828), np.float32)  # H x W
    # squash: the whole frame
    assert Preprocess(224)(wide, 224)[1].tolist() == [0, 0, 224, 224]
    # shorter side 224: 2320 -> 224, 2828 -> int(224 * 2828 / 2320) = 273; crop left round(24.5) = 24
    window = Preprocess(224, resize="shorter_side")(wide, 448)[1]
    torch.testing.assert_close(window, torch.tensor([0, 24 * 448 / 273, 448, 224 * 448 / 273]))
    # letterbox 256: 2828 -> 256, 2320 -> int(2320 * 256 / 2828) = 210, pad top 23; crop 16 of each side
    window = CARZERO(wide, 224)[1]
    torch.testing.assert_close(window, torch.tensor([(16 - 23) * 224 / 210, 16 * 224 / 256, 224 * 224 / 210, 196.0]))
    assert window[0] < 0, "the letterbox shows padding above the radiograph: the window starts above the frame"
    tall = np.zeros((300, 100), np.float32)
    # shorter side 224 on a tall image: columns 224, rows int(224 * 3) = 672, crop top 224
    torch.testing.assert_close(
        Preprocess(224, resize="shorter_side")(tall, 224)[1], torch.tensor([224 / 3, 0, 224 / 3, 224.0])
    )

def test_torch_library_resizes_in_float():
    image = np.linspace(0, 1, 100 * 80, dtype=np.float32).reshape(100, 80)
    inputs, _ = Preprocess(32, library="torch", mean=(0, 0, 0), std=(1, 1, 1))(image, 32)
    expected = torch.nn.functional.interpolate(
        torch.from_numpy(image)[None, None], size=(32, 32), mode="bilinear", antialias=True
    )[0, 0].clamp(0, 1)
    assert torch.equal(inputs[0], expected) and torch.equal(inputs[2], expected)
    assert not torch.equal(inputs[0] * 255, torch.round(inputs[0] * 255)), "no 8-bit step"

def test_equalize_first_then_truncate_to_eight_bits(radiograph):
    """MedKLIP on RSNA: equalise the native image, ``(255 * img).astype(np.uint8)``, RGB, then the transform."""
    _, image = radiograph
    equalised = equalize_histogram(torch.from_numpy(image)[None, None])[0, 0].numpy()
    eight_bit = Image.fromarray((255 * equalised).astype(np.uint8)).convert("RGB")
    reference = T.Compose([T.Resize([224, 224]), T.ToTensor(), T.Normalize(IMAGENET_MEAN, IMAGENET_STD)])(eight_bit)
    assert torch.equal(Preprocess(224, equalize=True)(image, 224)[0], reference)
    assert not torch.equal(Preprocess(224)(image, 224)[0], reference)

def test_invalid_configs_name_the_values():
    with pytest.raises(ValueError, match="resize_to=200"):
        Preprocess(224, resize_to=200)
    with pytest.raises(ValueError, match="grey native image"):
        Preprocess(8)(np.zeros((4, 4, 3), np.float32), 8)

@pytest.mark.parametrize("cache", [True, False])
def test_model_input_through_the_datamodule(tmp_path, monkeypatch, cache):
    """The transform set after setup (as a model's setup does) reaches the DataLoader workers; each
    batch carries model_input and window beside the unchanged frame image and masks."""
    monkeypatch.setenv("XBENCH_CACHE", str(tmp_path / "cache"))
    dm = Phantom(num_images=5, native_size=96, image_size=40, batch_size=2, num_workers=1, cache=cache)
    dm.prepare_data()
    dm.setup("test")
    without = list(dm.test_dataloader())
    clip_like = Preprocess(24, resize="shorter_side", resize_to=32, interpolation="bicubic")
    dm.set_model_transform(clip_like)
    batches = list(dm.test_dataloader())
    assert [b["index"].tolist() for b in batches] == [b["index"].tolist() for b in without]
    for plain, batch in zip(without, batches):
        count = len(batch["index"])
        assert batch["model_input"].shape == (count, 3, 24, 24) and batch["model_input"].dtype == torch.float32
        assert batch["window"].shape == (count, 4) and batch["window"].dtype == torch.float32
        assert torch.equal(batch["image"], plain["image"]) and torch.equal(batch["masks"], plain["masks"])
        for row, index in enumerate(batch["index"].tolist()):
            native = read_image(dm.samples[index].path)
            expected_input, expected_window = clip_like(native, 40)
            assert torch.equal(batch["model_input"][row], expected_input)
            assert torch.equal(batch["window"][row], expected_window)
    dm.set_model_transform(None)
    assert "model_input" not in next(iter(dm.test_dataloader()))
