"""SIIM-ACR: relative column-major RLE, the union rule, the split file, the real train-rle.csv."""

import csv
import gzip
import shutil
from collections import defaultdict

import numpy as np
import pytest

from conftest import real_file, run_oracle, write_dicom
from xbench.data.io import ImageReadError
from xbench.data.regions import RelativeRLE
from xbench.data.siim import SIIMPneumothorax

SIZE = 64


def encode_relative_rle(mask: np.ndarray) -> str:
    """The competition's encoder, written out: runs over the column-major pixel order, each
    start given relative to the end of the previous run."""
    flat = [bool(v) for v in mask.T.reshape(-1)]  # column by column, top to bottom
    numbers, previous_end, i = [], 0, 0
    while i < len(flat):
        if flat[i]:
            start = i
            while i < len(flat) and flat[i]:
                i += 1
            numbers += [start - previous_end, i - start]
            previous_end = i
        else:
            i += 1
    return " ".join(map(str, numbers))


def decode_by_loop(text: str, height: int, width: int) -> np.ndarray:
    """Pixel by pixel: index k is column k // height, row k % height."""
    mask = np.zeros((height, width), bool)
    values = [int(v) for v in text.split()]
    cursor = 0
    for offset, length in zip(values[0::2], values[1::2]):
        cursor += offset
        for k in range(cursor, cursor + length):
            mask[k % height, k // height] = True
        cursor += length
    return mask


def test_relative_rle_column_major_on_non_square_images():
    rng = np.random.default_rng(0)
    for height, width in ((7, 11), (12, 5), (1, 9)):
        mask = rng.random((height, width)) < 0.4
        mask[-1, -1] = True  # a run that ends on the last pixel
        text = encode_relative_rle(mask)
        decoded, clipped = RelativeRLE((text,)).to_mask(height, width)
        np.testing.assert_array_equal(decoded, mask)
        assert clipped == 0
    # hand-made: 3x4 image, pixels 1-2 (column 0, rows 1-2) then 2 + 3 = pixel 5 (column 1, row 2)
    decoded, _ = RelativeRLE(("1 2 2 1",)).to_mask(3, 4)
    expected = np.zeros((3, 4), bool)
    expected[1:3, 0] = True
    expected[2, 1] = True
    np.testing.assert_array_equal(decoded, expected)


def test_relative_rle_unites_overlapping_rows_and_rejects_overflow():
    first, second = np.zeros((6, 8), bool), np.zeros((6, 8), bool)
    first[1:4, 2:6] = True
    second[3:5, 4:8] = True  # overlaps `first` at rows 3, columns 4-5
    decoded, _ = RelativeRLE((encode_relative_rle(first), encode_relative_rle(second))).to_mask(6, 8)
    np.testing.assert_array_equal(decoded, first | second)
    with pytest.raises(ValueError, match=r"train-rle.csv, line 9: a run ends at pixel 49, past the 6x8 image"):
        RelativeRLE(("40 9",), "train-rle.csv, line 9").to_mask(6, 8)


def positive_mask(boxes: list[tuple[int, int, int, int]]) -> np.ndarray:
    mask = np.zeros((SIZE, SIZE), bool)
    for y1, y2, x1, x2 in boxes:
        mask[y1:y2, x1:x2] = True
    return mask


@pytest.fixture
def siim_root(tmp_path):
    """Three images in the stage-1 tree: A two instances (one row with, one without a leading
    space), B one instance (JPEG Baseline DICOM), C negative (JPEG 2000 DICOM)."""
    instances = {
        "1.2.3.1": [positive_mask([(4, 20, 6, 14)]), positive_mask([(16, 30, 10, 40)])],
        "1.2.3.2": [positive_mask([(40, 63, 50, 64)])],
    }
    rows = [
        ("1.2.3.1", " " + encode_relative_rle(instances["1.2.3.1"][0])),
        ("1.2.3.3", " -1"),
        ("1.2.3.2", encode_relative_rle(instances["1.2.3.2"][0])),
        ("1.2.3.1", encode_relative_rle(instances["1.2.3.1"][1])),
    ]
    with open(tmp_path / "train-rle.csv", "w", newline="") as handle:
        handle.write("ImageId, EncodedPixels\n")
        csv.writer(handle).writerows(rows)
    rng = np.random.default_rng(1)
    pixels = rng.integers(0, 256, size=(SIZE, SIZE), dtype=np.uint8)
    tree = tmp_path / "dicom-images-train"
    write_dicom(tree / "1.2.3.1.0" / "1.2.3.1.9" / "1.2.3.1.dcm", pixels)
    write_dicom(tree / "1.2.3.2.0" / "1.2.3.2.9" / "1.2.3.2.dcm", pixels, compression="jpeg")
    write_dicom(tree / "1.2.3.3.0" / "1.2.3.3.9" / "1.2.3.3.dcm", pixels, compression="j2k")
    return tmp_path, instances, rows


def test_fixture_union_masks_native_and_resized(siim_root):
    root, instances, _ = siim_root
    union = instances["1.2.3.1"][0] | instances["1.2.3.1"][1]
    dm = SIIMPneumothorax(root=str(root), image_size=SIZE, num_workers=0)
    dm.setup()
    assert dm.image_ids() == ["1.2.3.1", "1.2.3.3", "1.2.3.2"]  # file order, one sample per image
    by_id = {dm.test_set[i]["image_id"]: dm.test_set[i] for i in range(3)}
    np.testing.assert_array_equal(by_id["1.2.3.1"]["masks"][0].numpy(), union)
    np.testing.assert_array_equal(by_id["1.2.3.2"]["masks"][0].numpy(), instances["1.2.3.2"][0])
    assert [by_id[k]["labels"].item() for k in ("1.2.3.1", "1.2.3.2", "1.2.3.3")] == [1, 1, 0]
    assert [by_id[k]["has_mask"].item() for k in ("1.2.3.1", "1.2.3.2", "1.2.3.3")] == [True, True, False]
    assert dm.notes["rle_rows_merged"] == 1 and dm.notes["positive_images"] == 2

    resized = SIIMPneumothorax(root=str(root), image_size=SIZE // 2, num_workers=0)
    resized.setup()
    half = resized.test_set[0]["masks"][0].numpy()
    # each output pixel covers a 2x2 block; set when at least half (2 of 4 pixels) is covered
    expected = union.reshape(SIZE // 2, 2, SIZE // 2, 2).sum(axis=(1, 3)) >= 2
    np.testing.assert_array_equal(half, expected)


def test_split_file_dedupes_and_takes_all_rows_of_an_image(siim_root):
    root, instances, rows = siim_root
    # the split holds only A's second row, twice-listed image B, and C
    with open(root / "test.csv", "w", newline="") as handle:
        handle.write("ImageId,EncodedPixels\n")
        csv.writer(handle).writerows([rows[3], rows[2], rows[1], (rows[2][0], " " + rows[2][1])])
    dm = SIIMPneumothorax(root=str(root), split_file="test.csv", image_size=SIZE, num_workers=0)
    dm.setup()
    assert dm.image_ids() == ["1.2.3.1", "1.2.3.2", "1.2.3.3"]
    assert dm.notes["split_rows"] == 4 and dm.notes["split_rows_merged"] == 1
    assert dm.notes["split_images_with_rows_only_in_rle_file"] == 1
    np.testing.assert_array_equal(dm.test_set[0]["masks"][0].numpy(), instances["1.2.3.1"][0] | instances["1.2.3.1"][1])


def test_bad_input(siim_root):
    root, _, rows = siim_root
    (root / "test.csv").write_text("ImageId,EncodedPixels\n9.9.9,-1\n")
    with pytest.raises(ValueError, match=r"test.csv, line 2: ImageId 9.9.9 has no row in .*train-rle.csv"):
        _ = SIIMPneumothorax(root=str(root), split_file="test.csv").samples
    (root / "test.csv").write_text(f"ImageId,EncodedPixels\n1.2.3.1,{rows[2][1]}\n")
    with pytest.raises(ValueError, match=r"test.csv, line 2: this EncodedPixels of 1.2.3.1 is not among its rows"):
        _ = SIIMPneumothorax(root=str(root), split_file="test.csv").samples

    shutil.rmtree(root / "dicom-images-train" / "1.2.3.2.0")
    with pytest.raises(FileNotFoundError, match=r"no DICOM 1.2.3.2.dcm below"):
        _ = SIIMPneumothorax(root=str(root)).samples

    (root / "train-rle.csv").write_text("ImageId, EncodedPixels\n1.2.3.1, 5 3 2\n")
    with pytest.raises(ValueError, match=r"train-rle.csv, line 2: .*pairs"):
        _ = SIIMPneumothorax(root=str(root)).samples
    (root / "train-rle.csv").write_text("ImageId, EncodedPixels\n1.2.3.1, 5 3\n1.2.3.1, -1\n")
    with pytest.raises(ValueError, match=r"line 3: 1.2.3.1 has both -1"):
        _ = SIIMPneumothorax(root=str(root)).samples

    # a run past the image, and a truncated DICOM: errors when the sample is drawn
    (root / "train-rle.csv").write_text(f"ImageId, EncodedPixels\n1.2.3.1, {SIZE * SIZE - 2} 3\n1.2.3.3,-1\n")
    dm = SIIMPneumothorax(root=str(root), num_workers=0)
    dm.setup()
    with pytest.raises(ValueError, match=r"train-rle.csv, line\(s\) 2: a run ends at pixel 4097, past the 64x64"):
        dm.test_set[0]
    path = root / "dicom-images-train" / "1.2.3.3.0" / "1.2.3.3.9" / "1.2.3.3.dcm"
    path.write_bytes(path.read_bytes()[:400])
    with pytest.raises(ImageReadError, match="1.2.3.3.dcm"):
        dm.test_set[1]


@pytest.fixture(scope="module")
def real_siim(real_data, tmp_path_factory):
    """The real train-rle.csv decompressed, with an empty placeholder DICOM per image."""
    root = tmp_path_factory.mktemp("siim")
    with gzip.open(real_file(real_data, "siim/train-rle.csv.gz"), "rb") as source, open(root / "train-rle.csv", "wb") as target:
        shutil.copyfileobj(source, target)
    shutil.copy(real_file(real_data, "siim/mavl_test_split.csv"), root / "mavl_test_split.csv")
    rows = defaultdict(list)
    with open(root / "train-rle.csv") as handle:
        for image_id, text in list(csv.reader(handle))[1:]:
            rows[image_id].append(text.strip())
    (root / "dicom-images-train" / "study" / "series").mkdir(parents=True)
    for image_id in rows:
        (root / "dicom-images-train" / "study" / "series" / f"{image_id}.dcm").touch()
    return root, rows


def test_real_train_rle(real_siim):
    root, rows = real_siim
    dm = SIIMPneumothorax(root=str(root))
    samples = dm.samples
    assert len(samples) == 12047 and len({s.image_id for s in samples}) == 12047
    assert sum(s.labels["pneumothorax"] for s in samples) == 2669
    several = {image_id for image_id, texts in rows.items() if len(texts) > 1}
    assert len(several) == 624
    by_id = {s.image_id: s for s in samples}
    for image_id in several:  # the union rule: every row of the image is in its region
        assert sorted(by_id[image_id].regions["pneumothorax"].encodings) == sorted(rows[image_id])
    for image_id in sorted(several)[:3]:
        union = np.zeros((1024, 1024), bool)
        for text in rows[image_id]:
            union |= decode_by_loop(text, 1024, 1024)
        mask, _ = by_id[image_id].regions["pneumothorax"].to_mask(1024, 1024)
        np.testing.assert_array_equal(mask, union)


def test_real_mavl_split(real_siim):
    root, _ = real_siim
    dm = SIIMPneumothorax(root=str(root), split_file="mavl_test_split.csv")
    samples = dm.samples
    assert len(samples) == 2264 and sum(s.labels["pneumothorax"] for s in samples) == 594
    assert dm.notes["split_rows"] == 2317 and dm.notes["split_rows_merged"] == 2317 - 2264


def test_cli_end_to_end_with_the_benchmark_config(siim_root, tmp_path):
    root, _, rows = siim_root
    (root / "mavl_test_split.csv").write_text("ImageId,EncodedPixels\n" + "".join(f"{i},{t}\n" for i, t in rows))
    payload = run_oracle("siim", root, tmp_path / "results", image_size=SIZE)
    assert payload["data"]["images_evaluated"] == 3 and payload["data"]["notes"]["split_rows_merged"] == 1
    graded = payload["grounding"]["per_class"]["pneumothorax"]
    assert graded["pairs"] == 2 and graded["pointing_game"] == 1.0 and graded["dice@best"] == 1.0
