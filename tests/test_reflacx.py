"""REFLACX: release-format fixtures (metadata per phase, per-reading fixations, transcripts, ellipses,
chest boxes; tiny MIMIC-CXR-JPG images), the gaze density against a brute-force Gaussian sum, the
finding window, the leave-one-reader-out ceiling against an independent recomputation, and batches
identical with the cache on and off and for any worker count."""

import csv
import math
from pathlib import Path

import numpy as np
import pytest
import torch
from PIL import Image

from xbench.data.reflacx import REFLACX
from xbench.reads import read_id

HEIGHT, WIDTH = 40, 56
PHASE_1_LABELS = ["Atelectasis", "Enlarged cardiac silhouette", "Mass", "Nodule", "Other", "Support devices"]
PHASE_23_LABELS = ["Atelectasis", "Enlarged cardiac silhouette", "Lung nodule or mass", "Other", "Pleural abnormality",
                   "Quality issue", "Support devices"]
FIXATION_HEADER = ["timestamp_start_fixation", "timestamp_end_fixation", "x_position", "y_position",
                   "pupil_area_normalized", "angular_resolution_x_pixels_per_degree",
                   "angular_resolution_y_pixels_per_degree", "window_width", "window_level", "xmin_shown_from_image",
                   "ymin_shown_from_image", "xmax_shown_from_image", "ymax_shown_from_image",
                   "xmin_in_screen_coordinates", "ymin_in_screen_coordinates", "xmax_in_screen_coordinates",
                   "ymax_in_screen_coordinates"]
#: (phase, image, split, [(reading id, discarded, labels present)])
READINGS = [
    (1, "img-a", "test", [("P101R000001", False, {"Atelectasis": 5, "Mass": 3}),
                          ("P101R000002", False, {"Atelectasis": 4}),
                          ("P101R000003", False, {"Enlarged cardiac silhouette": 2})]),
    (2, "img-b", "test", [("P201R000004", False, {"Enlarged cardiac silhouette": 5}),
                          ("P201R000005", False, {"Enlarged cardiac silhouette": 3, "Atelectasis": 1}),
                          ("P201R000006", False, {"Enlarged cardiac silhouette": 4})]),
    (2, "img-c", "test", [("P202R000007", False, {"Atelectasis": 5}), ("P202R000008", True, {"Atelectasis": 5})]),
    (3, "img-d", "test", [("P300R000009", False, {"Lung nodule or mass": 5, "Enlarged cardiac silhouette": 3})]),
    (3, "img-e", "train", [("P300R000010", False, {"Atelectasis": 5})]),
    (3, "img-f", "train", [("P300R000011", False, {"Pleural abnormality": 5})]),
]
SENTENCES = [("there is atelectasis at the left base", 2.0, 4.0), ("the heart size is enlarged", 6.0, 8.5),
             ("a nodule in the right upper lobe", 12.0, 14.0)]


def _write(path, header, rows):
    path.parent.mkdir(parents=True, exist_ok=True)
    with open(path, "w", newline="\r\n") as handle:
        writer = csv.writer(handle, lineterminator="\n")  # newline="\r\n" writes CRLF, as the release
        writer.writerow(header)
        writer.writerows(rows)


def fixation_rows(seed):
    rng = np.random.default_rng(seed)
    rows, t = [], 0.0
    for _ in range(12):
        duration = float(rng.uniform(0.1, 1.5))
        x, y = int(rng.integers(0, WIDTH)), int(rng.integers(0, HEIGHT))
        shown = (0, 0, WIDTH, HEIGHT) if rng.random() < 0.5 else (4, 3, 50, 36)
        res = (int(rng.integers(3, 8)), int(rng.integers(3, 8)))
        rows.append([round(t, 3), round(t + duration, 3), x, y, 0.5, *res, 1.0, 0.5, *shown, 0, 0, 1920, 1080])
        t += duration + 0.2
    return rows


def write_release(root, mimic, *, discarded_label="False"):
    """REFLACX ``main_data/`` and the MIMIC-CXR-JPG images its metadata names."""
    seed = 0
    for phase in (1, 2, 3):
        labels = PHASE_1_LABELS if phase == 1 else PHASE_23_LABELS
        header = ["id", "split", "eye_tracking_data_discarded", "image", "dicom_id", "subject_id", "image_size_x",
                  "image_size_y", *labels]
        rows = []
        for row_phase, image, split, readings in READINGS:
            if row_phase != phase:
                continue
            dcm = f"physionet.org/files/mimic-cxr/2.0.0/files/p10/p100{seed:05}/s500{seed:05}/{image}.dcm"
            jpg = mimic / "files" / "p10" / f"p100{seed:05}" / f"s500{seed:05}" / f"{image}.jpg"
            jpg.parent.mkdir(parents=True, exist_ok=True)
            pixels = np.random.default_rng(seed).integers(0, 255, (HEIGHT, WIDTH), dtype=np.uint8)
            Image.fromarray(pixels).save(jpg)
            for reading, discarded, present in readings:
                seed += 1
                values = [present.get(name, 0) if name not in ("Other", "Support devices", "Quality issue") else
                          ("" if name == "Other" else "False") for name in labels]
                rows.append([reading, split, str(discarded) if discarded else discarded_label, dcm, image,
                             f"100{seed:05}", WIDTH, HEIGHT, *values])
                folder = root / "main_data" / reading
                _write(folder / "chest_bounding_box.csv", ["xmin", "ymin", "xmax", "ymax"], [[5, 4, 50, 36]])
                ellipses = [[10, 8, 30, 24, 7, *[name in present for name in labels]],
                            [12, 6, 20, 18, 1, *[name in present for name in labels]]]
                _write(folder / "anomaly_location_ellipses.csv", ["xmin", "ymin", "xmax", "ymax", "certainty", *labels],
                       ellipses)
                if discarded:
                    continue
                _write(folder / "fixations.csv", FIXATION_HEADER, fixation_rows(seed))
                words = []
                for text, start, end in SENTENCES:
                    tokens = text.split()
                    step = (end - start) / len(tokens)
                    words += [[w, round(start + i * step, 3), round(start + (i + 1) * step - 0.05, 3)]
                              for i, w in enumerate(tokens)]
                    words.append([".", round(end, 3), round(end + 0.1, 3)])
                _write(folder / "timestamps_transcription.csv", ["word", "timestamp_start_word", "timestamp_end_word"],
                       words)
        _write(root / "main_data" / f"metadata_phase_{phase}.csv", header, rows)


@pytest.fixture
def release(tmp_path):
    write_release(tmp_path / "reflacx", tmp_path / "mimic")
    return tmp_path / "reflacx", tmp_path / "mimic"


def datamodule(release, **options):
    root, mimic = release
    options = {"image_size": 16, "num_workers": 0, "cache": False, "batch_size": 2, **options}
    data = REFLACX(str(root), str(mimic), classes=["atelectasis", "cardiomegaly", "nodule_mass"], **options)
    data.prepare_data()
    data.setup("test")
    return data


def brute_density(rows, size, window=None):
    """The authors' heatmap rule written out as a loop over fixations and frame pixels: a duration-weighted
    2-D normal pdf of σ = one degree, scored at each frame pixel's centre if its native pixel was shown."""
    heat = np.zeros((size, size))
    for start, end, x, y, _, rx, ry, _, _, x0, y0, x1, y1, *_ in rows:
        weight = end - start
        if window is not None:
            weight = sum(max(0.0, min(end, hi) - max(start, lo)) for lo, hi in window if end > lo and start <= hi)
            if not any(end > lo and start <= hi for lo, hi in window):
                continue
        for i in range(size):
            cy = (i + 0.5) * HEIGHT / size - 0.5
            if not round(y0) <= math.floor(cy + 0.5) < round(y1):
                continue
            for k in range(size):
                cx = (k + 0.5) * WIDTH / size - 0.5
                if not round(x0) <= math.floor(cx + 0.5) < round(x1):
                    continue
                heat[i, k] += weight * math.exp(-((cx - x) ** 2 / (2 * rx**2) + (cy - y) ** 2 / (2 * ry**2))) / (
                    2 * math.pi * rx * ry)
    return heat / heat.sum()


def brute_counts(rows, size):
    grid = np.zeros((size, size))
    for row in rows:
        grid[int((row[3] + 0.5) * size // HEIGHT), int((row[2] + 0.5) * size // WIDTH)] += 1
    return grid


def rows_of(release, reading):
    with open(release[0] / "main_data" / reading / "fixations.csv") as handle:
        return [[float(v) for v in row] for row in list(csv.reader(handle))[1:]]


def batches(data):
    return [batch for batch in data.test_dataloader()]


def by_id(data):
    found = {}
    for batch in batches(data):
        for row, image_id in enumerate(batch["image_id"]):
            found[image_id] = {key: value[row] for key, value in batch.items() if isinstance(value, torch.Tensor)}
    return found


def test_parsing_labels_and_notes(release):
    data = datamodule(release)
    samples = {s.image_id: s for s in data.samples}
    assert sorted(samples) == ["img-a", "img-b", "img-c", "img-d"]  # img-e, img-f: train
    # img-a (phase 1): Mass spells nodule_mass; 2 of 3 report atelectasis; pleural_abnormality not asked in phase 1
    assert samples["img-a"].labels["atelectasis"] == 1 and samples["img-a"].labels["cardiomegaly"] == 0
    assert samples["img-a"].labels["pleural_abnormality"] == -1
    assert samples["img-d"].labels["nodule_mass"] == 1 and samples["img-d"].labels["pleural_abnormality"] == 0
    assert data.notes["readings_discarded"] == 1 and data.notes["readings"] == 8
    assert samples["img-a"].path.name == "img-a.jpg" and samples["img-a"].path.parent.name.startswith("s500")
    assert "atelectasis" in samples["img-a"].regions and "atelectasis" not in samples["img-b"].regions


def test_density_is_the_brute_force_gaussian_sum_and_sums_to_one(release):
    data = datamodule(release)
    found = by_id(data)
    rows = rows_of(release, "P300R000009")
    d = found["img-d"]
    assert d["has_gaze"].tolist() == [False, True, True]  # img-d reports cardiomegaly and the nodule
    for column in (1, 2):
        np.testing.assert_allclose(d["gaze"][column].numpy(), brute_density(rows, 16), rtol=1e-5, atol=1e-9)
        assert d["gaze"][column].sum().item() == pytest.approx(1.0, abs=1e-5)
        np.testing.assert_array_equal(d["fixations"][column].numpy(), brute_counts(rows, 16))
    assert d["gaze"][0].abs().sum() == 0 and d["fixations"][0].abs().sum() == 0
    # img-a: the mean of the two readings that report atelectasis
    mean = (brute_density(rows_of(release, "P101R000001"), 16) + brute_density(rows_of(release, "P101R000002"), 16)) / 2
    np.testing.assert_allclose(found["img-a"]["gaze"][0].numpy(), mean, rtol=1e-5, atol=1e-9)


def test_shuffled_fixations_are_the_other_images_counts(release):
    data = datamodule(release)
    found = by_id(data)
    per_image = {"img-a": ["P101R000001", "P101R000002", "P101R000003"], "img-b": ["P201R000004", "P201R000005",
                 "P201R000006"], "img-c": ["P202R000007"], "img-d": ["P300R000009"]}
    counts = {image: sum(brute_counts(rows_of(release, r), 16) for r in readings) for image, readings in per_image.items()}
    for image in per_image:
        others = sum(c for other, c in counts.items() if other != image)
        np.testing.assert_array_equal(found[image]["shuffled_fixations"].numpy(), others)


def word_start(sentence, word):
    text, start, end = SENTENCES[sentence]
    return round(start + word * (end - start) / len(text.split()), 3)


def test_the_finding_window_is_lanfredis_before_the_last_mention(release):
    """From 1.5 s before the sentence starts (not before the previous sentence starts) to the start of
    the word that ends the sentence's last mention; each fixation weighted by its overlap."""
    data = datamodule(release, gaze="finding")
    found = by_id(data)
    rows = rows_of(release, "P300R000009")
    # cardiomegaly: "the heart size is enlarged" names it by "heart size": up to the start of "size"
    window = [(max(6.0 - 1.5, 2.0), word_start(1, 2))]
    np.testing.assert_allclose(found["img-d"]["gaze"][1].numpy(), brute_density(rows, 16, window), rtol=1e-5, atol=1e-9)
    inside = [row for row in rows if row[1] > window[0][0] and row[0] <= window[0][1]]
    assert inside and len(inside) < len(rows)
    np.testing.assert_array_equal(found["img-d"]["fixations"][1].numpy(), brute_counts(inside, 16))
    # the nodule: "a nodule in the right upper lobe", up to the start of "nodule"; the previous sentence starts at 6.0
    window = [(max(12.0 - 1.5, 6.0), word_start(2, 1))]
    np.testing.assert_allclose(found["img-d"]["gaze"][2].numpy(), brute_density(rows, 16, window), rtol=1e-5, atol=1e-9)


def test_the_interobserver_ceiling_is_leave_one_reader_out(release):
    """Each read's reference is the plain mean of the other readers' densities (their
    ``score_interobserver``: ``np.average`` of the other users' heatmaps), recomputed here from the
    files with the brute-force loop; the human's map is the held-out reader's own density."""
    data = datamodule(release, reads=True, split="all")
    assert data.reads
    found = by_id(data)
    readers = ["P101R000001", "P101R000002", "P101R000003"]
    own = {r: brute_density(rows_of(release, r), 16) for r in readers}
    expected_ids = {read_id("img-a", r) for r in readers} | {read_id("img-b", r) for r in
                                                            ["P201R000004", "P201R000005", "P201R000006"]}
    assert set(found) == expected_ids  # img-c left out: one of its readings was discarded
    assert data.notes["images_left_out_of_reads_for_a_discarded_reading"] == 1
    assert data.notes["images_read_once"] == 3 and data.notes["images"] == 2 and data.notes["samples"] == 6
    reader_set = data.reader_set()
    for held_out in readers:
        sample = found[read_id("img-a", held_out)]
        others = np.stack([own[r] for r in readers if r != held_out])
        reference = np.average(others, axis=0)
        reported = held_out != "P101R000003"  # the third reader did not report atelectasis
        assert bool(sample["has_gaze"][0]) == reported
        if reported:
            np.testing.assert_allclose(sample["gaze"][0].numpy(), reference, rtol=1e-5, atol=1e-9)
        mark = reader_set.marks[read_id("img-a", held_out)]["atelectasis"]
        assert (mark.gaze is not None) == reported
        logits, maps = reader_set.frame_maps([read_id("img-a", held_out)], data.classes,
                                             torch.tensor([[HEIGHT, WIDTH]]), 16, 0.5)
        if reported:
            np.testing.assert_allclose(maps[0, 0].numpy(), own[held_out], rtol=1e-5, atol=1e-9)
            assert logits[0, 0] > 0


def test_the_centre_bias_is_the_mean_of_the_training_readings(release):
    data = datamodule(release)
    expected = (brute_density(rows_of(release, "P300R000010"), 16) + brute_density(rows_of(release, "P300R000011"), 16)) / 2
    np.testing.assert_allclose(data.gaze_baseline().numpy(), expected / expected.sum(), rtol=1e-5, atol=1e-9)


@pytest.mark.parametrize("gaze", ["reading", "finding"])
def test_batches_are_identical_with_the_cache_on_and_off_and_any_worker_count(release, gaze, tmp_path, monkeypatch):
    monkeypatch.setenv("XBENCH_CACHE", str(tmp_path / "cache"))
    runs = [batches(datamodule(release, gaze=gaze, cache=cache, num_workers=workers))
            for cache, workers in ((False, 0), (True, 0), (True, 2), (False, 2))]
    for other in runs[1:]:
        assert len(other) == len(runs[0])
        for first, second in zip(runs[0], other):
            assert first.keys() == second.keys() and {"gaze", "fixations", "has_gaze", "shuffled_fixations"} <= set(first)
            for key, value in first.items():
                if isinstance(value, torch.Tensor):
                    assert torch.equal(value, second[key]), key
                else:
                    assert value == second[key]


@pytest.mark.parametrize(("model", "extra"), [("random", []), ("human", ["--data.reads", "true", "--data.split", "all"])])
def test_a_model_and_the_interobserver_reader_run_through_xbench_test(release, tmp_path, model, extra):
    """Every batch carries the gaze keys beside the masks; a run grades the ellipses as any dataset's
    regions, and the human reader of the reads mode runs as a model, its map the held-out reading's gaze."""
    import json

    from conftest import only_folder, run_args
    from xbench.test import main

    root, mimic = release
    main(run_args(model, "reflacx", root, tmp_path / "results", "--data.images_root", str(mimic),
                  "--trainer.logger", "false", *extra, image_size=32))
    payload = json.loads((only_folder(tmp_path / "results") / "metrics.json").read_text())
    assert payload["data"]["images_evaluated"] == (6 if extra else 4)
    assert payload["model"] == ("human:reflacx-interobserver" if extra else "random")
    if extra:
        assert payload["human"] is True and payload["reader_set"]["name"] == "reflacx-interobserver"
        assert "leave one reader out" in payload["reader_set"]["rule"]


GOLDEN = Path(__file__).parent / "golden" / "reflacx_heatmaps.npz"


def test_the_density_equals_the_authors_heatmaps(tmp_path):
    """The authors' own ``create_heatmap`` (the whole reading, ricbl/eyetracking) and their sentence
    ``create_heatmap`` at their default window (ricbl/eye-tracking-localization), run by
    ``tools/parity/reflacx_heatmaps.py`` on a square image whose frame pixels are its native pixels:
    the batch's gaze equals theirs, normalised to sum 1, in both modes."""
    import json

    golden = np.load(GOLDEN)
    meta = json.loads(str(golden["meta"]))
    side, root, mimic = meta["side"], tmp_path / "reflacx", tmp_path / "mimic"
    labels = ["Atelectasis", "Enlarged cardiac silhouette", "Lung nodule or mass"]
    header = ["id", "split", "eye_tracking_data_discarded", "image", "dicom_id", "subject_id", "image_size_x",
              "image_size_y", *labels]
    for phase in (1, 2):
        _write(root / "main_data" / f"metadata_phase_{phase}.csv", header, [])
    dcm = "physionet.org/files/mimic-cxr/2.0.0/files/p10/p10000001/s50000001/img-g.dcm"
    jpg = mimic / "files" / "p10" / "p10000001" / "s50000001" / "img-g.jpg"
    jpg.parent.mkdir(parents=True)
    Image.new("L", (side, side), 100).save(jpg)
    _write(root / "main_data" / "metadata_phase_3.csv", header,
           [["P300R000099", "test", "False", dcm, "img-g", "10000001", side, side, 5, 5, 5]])
    folder = root / "main_data" / "P300R000099"
    _write(folder / "fixations.csv", meta["columns"], [[int(v) if v == int(v) and i > 1 else v for i, v in enumerate(row)]
                                                      for row in golden["rows"].tolist()])
    _write(folder / "timestamps_transcription.csv", ["word", "timestamp_start_word", "timestamp_end_word"], meta["words"])
    _write(folder / "anomaly_location_ellipses.csv", ["xmin", "ymin", "xmax", "ymax", "certainty", *labels], [])
    for gaze, expected in (("reading", [golden["whole"]] * 3), ("finding", list(golden["windowed"]))):
        data = REFLACX(str(root), str(mimic), classes=["atelectasis", "cardiomegaly", "nodule_mass"], image_size=side,
                       num_workers=0, cache=False, gaze=gaze)
        data.setup("test")
        (sample,) = by_id(data).values()
        for column, theirs in enumerate(expected):
            theirs = theirs.astype(np.float64) / theirs.sum()
            np.testing.assert_allclose(sample["gaze"][column].numpy(), theirs, rtol=1e-4, atol=1e-6 * theirs.max())


def test_an_ellipse_region_is_the_inscribed_ellipse_by_pixel_index():
    """``skimage.draw.ellipse``'s rule (the authors draw REFLACX's ellipses with it), written as a loop:
    pixel (r, c) is inside when ((c - cx) / ax)² + ((r - cy) / ay)² < 1; a box reaching outside the
    image is clipped and counted."""
    from xbench.data.regions import Ellipses

    boxes = ((3, 2, 17, 9), (-4, 10, 6, 19))
    mask, clipped = Ellipses(boxes).to_mask(20, 24)
    expected = np.zeros((20, 24), dtype=bool)
    for x1, y1, x2, y2 in boxes:
        cx, cy, ax, ay = (x1 + x2) / 2, (y1 + y2) / 2, (x2 - x1) / 2, (y2 - y1) / 2
        for r in range(20):
            for c in range(24):
                expected[r, c] |= ((c - cx) / ax) ** 2 + ((r - cy) / ay) ** 2 < 1
    np.testing.assert_array_equal(mask, expected)
    assert clipped == 1 and mask[5, 10] and not mask[2, 3]


def test_a_finding_reported_but_never_named_has_no_finding_gaze_and_is_counted(release):
    root, mimic = release
    data = REFLACX(str(root), str(mimic), classes=["atelectasis", "pleural_abnormality"], split="all", gaze="finding",
                   image_size=16, num_workers=0, cache=False)
    data.setup("test")
    assert data.notes["gaze_reported_but_not_named_in_the_dictation"] == {"pleural_abnormality": 1}  # img-f's reading
    row = [s.image_id for s in data.samples].index("img-f")
    assert data.samples[row].labels["pleural_abnormality"] == 1 and not data.test_set[row]["has_gaze"][1]
