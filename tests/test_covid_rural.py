"""COVID-19 Rural: non-square 3-channel JPEGs, 0/1 PNG masks, missing/empty masks, the split."""

import csv

import numpy as np
import pytest
from PIL import Image

from conftest import real_file, run_oracle
from xbench.data.covid_rural import COVIDRural

HEIGHT, WIDTH = 20, 40  # wider than high, as many COVID-Rural radiographs


def write_jpg(path, grey: np.ndarray) -> None:
    Image.fromarray(np.repeat(grey[..., None], 3, axis=2)).save(path, quality=100)


@pytest.fixture
def covid_root(tmp_path):
    """Four images: A positive, B no mask file, C an all-zero mask, D positive; split lists D, A, B, C."""
    (tmp_path / "jpgs" / "jsons").mkdir(parents=True)
    (tmp_path / "pngs_masks").mkdir()
    grey = np.tile(np.linspace(0, 255, WIDTH).astype(np.uint8), (HEIGHT, 1))
    for stem in "ABCD":
        write_jpg(tmp_path / "jpgs" / f"COVID-19-AR-{stem}.jpg", grey)
    masks = {"A": np.zeros((HEIGHT, WIDTH), np.uint8), "C": np.zeros((HEIGHT, WIDTH), np.uint8)}
    masks["A"][3:11, 5:30] = 1
    masks["D"] = np.zeros((HEIGHT, WIDTH), np.uint8)
    masks["D"][12:20, 31:40] = 1
    for stem, mask in masks.items():
        Image.fromarray(mask).save(tmp_path / "pngs_masks" / f"COVID-19-AR-{stem}.png")
    with open(tmp_path / "mavl_test_split.csv", "w", newline="") as handle:
        csv.writer(handle).writerows([["filepath"]] + [[f"COVID-19-AR-{s}"] for s in "DABC"])
    return tmp_path, masks, grey


def test_labels_counts_and_masks_native_and_resized(covid_root):
    root, masks, grey = covid_root
    with pytest.warns(UserWarning, match="1 image.* without a mask file and 1 with an all-zero mask"):
        dm = COVIDRural(root=str(root), split_file="mavl_test_split.csv", image_size=20, num_workers=0)
        dm.setup()
    assert dm.image_ids() == [f"COVID-19-AR-{s}" for s in "DABC"]
    assert [s.labels["covid19"] for s in dm.samples] == [1, 1, 0, 0]
    assert dm.notes["negatives_without_mask_file"] == 1 and dm.notes["negatives_with_empty_mask"] == 1
    assert dm.notes["images"] == 4 and dm.notes["positive_images"] == 2
    for i, stem in enumerate("DA"):
        native, clipped = dm.samples[i].regions["covid19"].to_mask(HEIGHT, WIDTH)
        np.testing.assert_array_equal(native, masks[stem].astype(bool))
        assert clipped == 0
        # 40 x 20 -> 20 x 20: pairs of columns; set when half or more of the pair is covered
        expected = masks[stem].reshape(HEIGHT, WIDTH // 2, 2).mean(axis=2) >= 0.5
        item = dm.test_set[i]
        np.testing.assert_array_equal(item["masks"][0].numpy(), expected)
        assert item["has_mask"].item()
    image = dm.test_set[0]["image"][0].numpy()
    expected_image = grey.reshape(HEIGHT, WIDTH // 2, 2).mean(axis=2) / 255
    np.testing.assert_allclose(image, expected_image, atol=3 / 255)
    assert not dm.test_set[2]["has_mask"].any() and not dm.test_set[3]["has_mask"].any()


def test_without_split_every_jpg_is_a_sample(covid_root):
    root, _, _ = covid_root
    with pytest.warns(UserWarning):
        dm = COVIDRural(root=str(root))
        assert dm.image_ids() == [f"COVID-19-AR-{s}" for s in "ABCD"]


def test_bad_input(covid_root):
    root, _, _ = covid_root
    (root / "split.csv").write_text("filepath\nCOVID-19-AR-A\nCOVID-19-AR-Z\n")
    with pytest.raises(FileNotFoundError, match=r"split.csv, line 3: image COVID-19-AR-Z.jpg not found"):
        _ = COVIDRural(root=str(root), split_file="split.csv").samples
    (root / "split.csv").write_text("filepath\nCOVID-19-AR-A\n")
    Image.fromarray(np.ones((HEIGHT, WIDTH - 1), np.uint8)).save(root / "pngs_masks" / "COVID-19-AR-A.png")
    dm = COVIDRural(root=str(root), split_file="split.csv", num_workers=0)
    dm.setup()
    with pytest.raises(ValueError, match=r"COVID-19-AR-A.png is 39x20 \(width x height\) but its image is 40x20"):
        dm.test_set[0]
    Image.fromarray(np.full((HEIGHT, WIDTH), 255, np.uint8)).save(root / "pngs_masks" / "COVID-19-AR-A.png")
    with pytest.raises(ValueError, match=r"COVID-19-AR-A.png: expected values 0 and 1 only, found \[255\]"):
        _ = COVIDRural(root=str(root), split_file="split.csv").samples


def test_real_mavl_split(real_data, tmp_path):
    (tmp_path / "jpgs").mkdir()
    (tmp_path / "pngs_masks").mkdir()
    split = real_file(real_data, "covid_rural/mavl_test_split.csv")
    (tmp_path / "test.csv").write_bytes(split.read_bytes())
    with open(split) as handle:
        stems = [row["filepath"] for row in csv.DictReader(handle)]
    for stem in stems:
        (tmp_path / "jpgs" / f"{stem}.jpg").touch()
    with pytest.warns(UserWarning, match="45 image"):
        dm = COVIDRural(root=str(tmp_path), split_file="test.csv")
        assert dm.image_ids() == stems and len(set(stems)) == 45
    assert dm.notes["negatives_without_mask_file"] == 45


def test_cli_end_to_end_with_the_benchmark_config(covid_root, tmp_path):
    root, _, _ = covid_root
    with pytest.warns(UserWarning, match="without a mask file"):
        payload = run_oracle("covid_rural", root, tmp_path / "results", image_size=20)
    assert payload["data"]["images_evaluated"] == 4 and payload["data"]["notes"]["negatives_with_empty_mask"] == 1
    graded = payload["grounding"]["per_class"]["covid19"]
    assert graded["pairs"] == 2 and graded["pointing_game"] == 1.0 and graded["dice@best"] == 1.0
