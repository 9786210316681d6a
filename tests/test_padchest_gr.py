"""PadChest-GR: a small release written in its own format (grounded reports JSON, master table,
16-bit PNGs) with positive, negative and normal studies and two readers, read into samples,
queries, masks and the second reader's marks; the second reader scored against the first through
``python -m xbench.test`` with the human model, equal to a brute-force recomputation."""

import json

import numpy as np
import pytest
import torch
import yaml

from conftest import CONFIGS, only_folder, run_args, write_padchest_gr
from xbench.data.cache import CachedDataset
from xbench.data.padchest_gr import PadChestGR
from xbench.data.queries import Query
from xbench.data.regions import Boxes, NormalisedBoxes
from xbench.findings import DEFAULT_CLASSES
from xbench.models.base import XBenchModel
from xbench.test import main

WIDTH, HEIGHT = 64, 48
FRAME = 16  # a 4 x 3 block of native pixels per frame pixel: area coverage is a block's mean
POSITIVE, DENIALS, NORMAL, TRAIN, FIRST_ONLY = "pos.png", "denials.png", "normal.png", "train.png", "first-only.png"
UNKNOWN = "unknown.png"


def sentence(text, labels, abnormal=True, boxes=(), extra_boxes=()):
    return {"sentence_en": text, "sentence_es": "", "labels": list(labels), "locations": [], "progression": None,
            "abnormal": abnormal, "boxes": [list(b) for b in boxes], "extra_boxes": [list(b) for b in extra_boxes]}


HEART, HEART_2 = (0.25, 0.25, 0.75, 0.75), (0.3125, 0.25, 0.8125, 0.6875)
RIGHT_EFFUSION, RIGHT_EFFUSION_2 = (0.0, 0.5, 0.25, 1.0), (0.0, 0.625, 0.3125, 1.0)
LEFT_EFFUSION = (0.75, 0.5, 1.0, 1.0)
NODULE, NODULE_2 = (0.1, 0.25, 0.5, 0.75), (0.15, 0.3, 0.45, 0.7)
STUDIES = [
    {"StudyID": "s-pos", "ImageID": POSITIVE, "PreviousStudyID": None, "findings": [
        sentence("Cardiomegaly.", ["cardiomegaly"], boxes=[HEART], extra_boxes=[HEART_2]),
        sentence("Small right pleural effusion.", ["pleural effusion"], boxes=[RIGHT_EFFUSION],
                 extra_boxes=[RIGHT_EFFUSION_2]),
        sentence("Left effusion blunting the angle.", ["pleural effusion", "costophrenic angle blunting"],
                 boxes=[LEFT_EFFUSION]),
        sentence("No pneumothorax.", ["pneumothorax"], abnormal=False),
        sentence("Aortic atheromatosis.", ["aortic atheromatosis"], boxes=[(0.4, 0.1, 0.6, 0.3)]),
    ]},
    {"StudyID": "s-denials", "ImageID": DENIALS, "findings": [
        sentence("Nodule in the right mid lung.", ["nodule"], boxes=[NODULE], extra_boxes=[NODULE_2]),
        sentence("No pleural effusion.", ["pleural effusion"], abnormal=False),
        sentence("No cardiomegaly.", ["cardiomegaly"], abnormal=False),
    ]},
    {"StudyID": "s-normal", "ImageID": NORMAL, "findings": [
        sentence("Normal chest.", ["normal"], abnormal=False),
        sentence("No consolidation.", ["consolidation"], abnormal=False),
    ]},
    {"StudyID": "s-train", "ImageID": TRAIN, "findings": [
        sentence("Basal atelectasis.", ["atelectasis"], boxes=[(0.1, 0.6, 0.4, 0.9)], extra_boxes=[(0.1, 0.6, 0.4, 0.9)]),
    ]},
    {"StudyID": "s-first-only", "ImageID": FIRST_ONLY, "findings": [
        sentence("Scoliosis.", ["scoliosis"], boxes=[(0.4, 0.0, 0.6, 1.0)]),
    ]},
    {"StudyID": "s-unknown", "ImageID": UNKNOWN, "findings": [  # abnormal, by a finding XBench does not grade
        sentence("Aortic atheromatosis.", ["aortic atheromatosis"], boxes=[(0.4, 0.1, 0.6, 0.3)]),
    ]},
]
TEST_IMAGES = [POSITIVE, DENIALS, NORMAL, FIRST_ONLY, UNKNOWN]


@pytest.fixture
def release(tmp_path):
    return write_padchest_gr(tmp_path / "padchest-gr", STUDIES, size=(WIDTH, HEIGHT), splits={"s-train": "train"})


def data(root, **kwargs) -> PadChestGR:
    return PadChestGR(root=str(root), num_workers=0, cache=False, image_size=FRAME, **kwargs)


def native_mask(boxes, height=HEIGHT, width=WIDTH) -> np.ndarray:
    """The union of normalised boxes, pixel by pixel: a pixel (r, c) is inside when its column is in
    [floor(x1 W), floor(x2 W)) and its row in [floor(y1 H), floor(y2 H)) (every box here spans pixels)."""
    mask = np.zeros((height, width), dtype=bool)
    for x1, y1, x2, y2 in boxes:
        for r in range(height):
            for c in range(width):
                if int(x1 * width) <= c < int(x2 * width) and int(y1 * height) <= r < int(y2 * height):
                    mask[r, c] = True
    return mask


def frame_mask(boxes) -> np.ndarray:
    """The native mask in the 16 x 16 frame: a frame pixel is set when at least half its 4 x 3 block is."""
    blocks = native_mask(boxes).reshape(FRAME, HEIGHT // FRAME, FRAME, WIDTH // FRAME)
    return blocks.mean(axis=(1, 3)) >= 0.5


def test_studies_sentences_labels_and_counts(release):
    dm = data(release)
    assert dm.classes == list(DEFAULT_CLASSES["padchest_gr"])
    assert dm.image_ids() == TEST_IMAGES  # file order; the train study left out
    labels = {sample.image_id: sample.labels for sample in dm.samples}
    positive = {key for key, value in labels[POSITIVE].items() if value == 1}
    assert positive == {"cardiomegaly", "pleural_effusion", "costophrenic_angle_blunting"}
    assert labels[POSITIVE]["pneumothorax"] == 0  # denied
    assert {key for key, value in labels[DENIALS].items() if value} == {"nodule"}
    assert set(labels[NORMAL].values()) == {0}  # a normal study: a negative for every class
    denied = {sample.image_id: [(q.text, q.finding, q.region) for q in sample.queries if not q.asserted]
              for sample in dm.samples}
    assert denied == {
        POSITIVE: [("No pneumothorax.", "pneumothorax", None)],
        DENIALS: [("No pleural effusion.", "pleural_effusion", None), ("No cardiomegaly.", "cardiomegaly", None)],
        NORMAL: [("No consolidation.", "consolidation", None)],
        FIRST_ONLY: [],
        UNKNOWN: [],
    }
    notes = dm.notes
    assert (notes["images"], notes["abnormal_studies"], notes["normal_studies"]) == (5, 4, 1)
    assert set(labels[UNKNOWN].values()) == {0} and not dm.samples[4].queries  # abnormal, but nothing graded
    assert (notes["positive_sentences"], notes["negative_sentences"]) == (5, 4)
    assert (notes["boxed_by_both"], notes["boxed_by_first_only"], notes["boxed_by_neither"]) == (3, 2, 0)
    assert notes["sentences_outside_vocabulary"] == 3
    assert notes["labels_outside_vocabulary"] == {"aortic atheromatosis": 2, "normal": 1}
    assert notes["negative_sentences_per_finding"]["pleural_effusion"] == 1
    assert notes["negative_sentences_with_boxes"] == 0 and (notes["queries"], notes["denied_queries"]) == (6, 4)
    assert dm.reader_set() is None  # readers="first": no reader under test


def test_positive_sentences_are_the_queries_and_negatives_never_are(release):
    dm = data(release)
    queries = {sample.image_id: sample.queries for sample in dm.samples}
    region = lambda *boxes: NormalisedBoxes(Boxes(boxes))  # noqa: E731
    assert queries[POSITIVE] == (
        Query("Cardiomegaly.", "cardiomegaly", region(HEART)),
        Query("Small right pleural effusion.", "pleural_effusion", region(RIGHT_EFFUSION)),
        Query("Left effusion blunting the angle.", "pleural_effusion", region(LEFT_EFFUSION)),
        Query("Left effusion blunting the angle.", "costophrenic_angle_blunting", region(LEFT_EFFUSION)),
        Query("No pneumothorax.", "pneumothorax", None, asserted=False),
    )
    assert queries[NORMAL] == (Query("No consolidation.", "consolidation", None, asserted=False),)
    assert [query.asserted for query in queries[DENIALS]] == [True, False, False]
    assert dm.query_slots == 5 and "No cardiomegaly." in dm.phrases  # a denied sentence's phrase is scored
    regions = next(sample for sample in dm.samples if sample.image_id == POSITIVE).regions
    assert regions["pleural_effusion"] == region(RIGHT_EFFUSION, LEFT_EFFUSION)  # the union of its sentences


def test_boxes_become_masks_at_their_pixels_natively_and_in_the_frame(release):
    dm = data(release)
    samples = {sample.image_id: sample for sample in dm.samples}
    # worked by hand: x 0.1 * 64 = 6.4 -> column 6, 0.5 * 64 -> 32 (exclusive); y 0.25 * 48 = 12, 0.75 * 48 = 36
    mask, clipped = samples[DENIALS].regions["nodule"].to_mask(HEIGHT, WIDTH)
    rows, columns = np.nonzero(mask)
    assert (rows.min(), rows.max(), columns.min(), columns.max(), clipped) == (12, 35, 6, 31, 0)
    assert np.array_equal(mask, native_mask([NODULE]))
    # a non-square image of another size: x scales by its width, y by its height
    assert np.array_equal(samples[DENIALS].regions["nodule"].to_mask(30, 100)[0], native_mask([NODULE], 30, 100))
    dm.setup("test")
    classes = dm.classes
    for index, image_id in enumerate(dm.image_ids()):
        record = dm.test_set[index]
        assert record["image"].shape == (1, FRAME, FRAME) and record["native_size"].tolist() == [HEIGHT, WIDTH]
        for key, region in samples[image_id].regions.items():
            assert np.array_equal(record["masks"][classes.index(key)].numpy(), frame_mask(region.boxes.xyxy))
        assert record["has_mask"].sum() == len(samples[image_id].regions)
        for slot, query in enumerate(samples[image_id].queries):
            expected = frame_mask(query.region.boxes.xyxy) if query.asserted else np.zeros((FRAME, FRAME), bool)
            assert np.array_equal(record["query_masks"][slot].numpy(), expected)
            assert dm.phrases[record["query_phrase"][slot]] == query.text
        # a denied finding is never graded: no region, not lost, marked in query_asserted
        asserted = [query.asserted for query in samples[image_id].queries]
        assert record["query_has_mask"].tolist() == asserted + [False] * (dm.query_slots - len(asserted))
        assert record["query_asserted"].tolist() == asserted + [False] * (dm.query_slots - len(asserted))
        assert not record["query_lost"].any()


def test_the_decoded_image_cache_gives_the_same_batches_denied_queries_included(release, tmp_path, monkeypatch):
    plain = data(release, batch_size=3)
    plain.setup("test")
    monkeypatch.setenv("XBENCH_CACHE", str(tmp_path / "cache"))
    cached = PadChestGR(root=str(release), num_workers=0, cache=True, image_size=FRAME, batch_size=3)
    cached.prepare_data()
    cached.setup("test")
    assert isinstance(cached.test_set, CachedDataset)
    for want, have in zip(plain.test_dataloader(), cached.test_dataloader(), strict=True):
        assert want.keys() == have.keys() and "query_asserted" in want
        for name, value in want.items():
            assert torch.equal(value, have[name]) if isinstance(value, torch.Tensor) else value == have[name], name


def test_both_readers_keep_the_sentences_both_boxed_and_name_the_second_reader(release):
    dm = data(release, readers="both")
    assert dm.image_ids() == [POSITIVE, DENIALS]  # the normal, first-reader-only and ungraded studies left out
    assert dm.notes["studies_without_a_sentence_both_boxed"] == 3
    positive = dm.samples[0]
    assert set(positive.regions) == {"cardiomegaly", "pleural_effusion"}  # the left effusion: reader 1 only
    assert positive.regions["pleural_effusion"] == NormalisedBoxes(Boxes((RIGHT_EFFUSION,)))
    assert [query.text for query in positive.queries if query.asserted] == ["Cardiomegaly.",
                                                                             "Small right pleural effusion."]
    assert positive.labels["costophrenic_angle_blunting"] == 1  # still stated, only not graded
    readers = dm.reader_set()
    assert readers.name == "padchest-gr-reader2" and readers.model_name == "human:padchest-gr-reader2"
    assert set(readers.marks) == {POSITIVE, DENIALS}
    assert {key: mark.region for key, mark in readers.marks[POSITIVE].items()} == {
        "cardiomegaly": NormalisedBoxes(Boxes((HEART_2,))),
        "pleural_effusion": NormalisedBoxes(Boxes((RIGHT_EFFUSION_2,))),
    }
    assert all(mark.label == 1 for marks in readers.marks.values() for mark in marks.values())


def brute_force_agreement(image_ids) -> dict[str, dict[str, float]]:
    """Reader 2 against reader 1, per finding, from the release itself: each study's sentences both
    readers boxed, each reader's union per finding in the frame; the reader's map is its region (1
    inside, 0 outside after min-max), so its maximum is the whole region: a hit when the region
    touches the reference, and at tau = 0.5 the predicted pixels are the region."""
    values: dict[str, list[tuple[float, float, float]]] = {}
    for study in STUDIES:
        if study["ImageID"] not in image_ids:
            continue
        first, second = {}, {}
        for found in study["findings"]:
            if found["abnormal"] and found["boxes"] and found["extra_boxes"]:
                for label in found["labels"]:
                    key = {"cardiomegaly": "cardiomegaly", "pleural effusion": "pleural_effusion", "nodule": "nodule"}[label]
                    first.setdefault(key, []).extend(found["boxes"])
                    second.setdefault(key, []).extend(found["extra_boxes"])
        for key in first:
            reference, region = frame_mask(first[key]), frame_mask(second[key])
            inter = (reference & region).sum()
            values.setdefault(key, []).append((float(inter > 0), 2 * inter / (reference.sum() + region.sum()),
                                               inter / (reference | region).sum()))
    return {key: dict(zip(("pointing_game", "dice@0.5", "iou@0.5"), np.mean(rows, axis=0)))
            for key, rows in values.items()}


def test_the_second_reader_scored_by_the_human_model_equals_a_brute_force_recomputation(release, tmp_path):
    main(run_args("human", "padchest_gr", release, tmp_path / "results", "--data.readers", "both",
                  "--data.cache", "false", image_size=FRAME))
    folder = only_folder(tmp_path / "results")
    results = json.loads((folder / "metrics.json").read_text())
    assert results["model"] == "human:padchest-gr-reader2" and results["human"] is True
    assert results["reader_set"]["name"] == "padchest-gr-reader2"
    assert "both readers boxed" in results["reader_set"]["rule"]
    expected = brute_force_agreement([POSITIVE, DENIALS])
    per_class = results["grounding"]["per_class"]
    graded = {key for key, values in per_class.items() if values["pairs"]}
    assert graded == set(expected) == {"cardiomegaly", "pleural_effusion", "nodule"}
    for key, values in expected.items():
        for name, value in values.items():
            assert per_class[key][name] == pytest.approx(value, abs=1e-9), (key, name)
    assert 0 < expected["cardiomegaly"]["dice@0.5"] < 1  # the readers differ: not a trivial 1
    notes = results["data"]["notes"]  # what the human row leaves out, counted
    assert (notes["boxed_by_first_only"], notes["studies_without_a_sentence_both_boxed"]) == (2, 3)


def test_the_config_names_the_dataset_and_its_defaults():
    config = yaml.safe_load((CONFIGS / "data" / "padchest_gr.yaml").read_text())["data"]
    assert config["class_path"] == "xbench.data.padchest_gr.PadChestGR"
    assert config["init_args"]["split"] == "test" and config["init_args"]["readers"] == "first"


# -- recognition of denied findings: stated against denied sentences, with an interval -----------------

#: Each phrase's score (its logit): stated sentences mostly above denied ones, with a tie across kinds.
SCORES = {"Cardiomegaly.": 2.0, "Mild cardiomegaly.": 0.5, "Enlarged heart.": -1.0, "No cardiomegaly.": -2.0,
          "Heart size normal, no cardiomegaly.": 0.5, "Nodule.": 1.0, "No nodules.": 1.5, "No nodule seen.": -0.5}


class ScoresByText(XBenchModel):
    """A phrase-mode toy: each phrase's logit is `SCORES`' plus ten times the image's mean grey
    level (so that a sentence's score depends on its image too), its map a ramp."""

    name = "scores_by_text"
    query_mode = "phrase"

    def build(self, classes: list[str]) -> None:
        self.register_buffer("score", torch.zeros(len(classes)), persistent=False)

    def encode_phrases(self, phrases: list[str]) -> dict[str, torch.Tensor]:
        return {"score": torch.tensor([SCORES[phrase] for phrase in phrases])}

    def forward(self, image: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        ramp = torch.arange(16.0).view(1, 1, 4, 4).expand(len(image), len(self.score), 4, 4)
        return self.score[None] + 10 * image.mean(dim=(1, 2, 3))[:, None], ramp


def recognition_release(root):
    """Eight studies (two normal) with stated and denied cardiomegaly and nodule sentences."""
    stated = lambda text, labels: sentence(text, labels, boxes=[HEART])  # noqa: E731
    denied = lambda text, labels: sentence(text, labels, abnormal=False)  # noqa: E731
    studies = [
        [stated("Cardiomegaly.", ["cardiomegaly"]), denied("No nodules.", ["nodule"])],
        [stated("Mild cardiomegaly.", ["cardiomegaly"]), stated("Nodule.", ["nodule"])],
        [denied("No cardiomegaly.", ["cardiomegaly"]), denied("No nodule seen.", ["nodule"])],
        [denied("Heart size normal, no cardiomegaly.", ["cardiomegaly"])],
        [stated("Enlarged heart.", ["cardiomegaly"]), stated("Nodule.", ["nodule"])],
        [denied("No cardiomegaly.", ["cardiomegaly"]), denied("No nodules.", ["nodule"])],
        [stated("Cardiomegaly.", ["cardiomegaly"])],
        [denied("Heart size normal, no cardiomegaly.", ["cardiomegaly"]), stated("Nodule.", ["nodule"])],
    ]
    return write_padchest_gr(root, [{"StudyID": f"s{i}", "ImageID": f"i{i}.png", "findings": found}
                                    for i, found in enumerate(studies)], size=(WIDTH, HEIGHT))


def brute_force_sentence_auroc(records, image_ids, replicates, dataset):
    """The AUROC of ``key``'s stated against its denied sentences by scikit-learn, on the sample and on
    each replicate: an image drawn m times weighs its sentences m times (the same draws as the run's)."""
    from sklearn.metrics import roc_auc_score

    from xbench.metrics.bootstrap import random_stream, resample_weights

    order = sorted(range(len(image_ids)), key=lambda i: image_ids[i])
    weights = resample_weights(len(order), replicates, random_stream(0, dataset, "test")).numpy()
    row = {index: position for position, index in enumerate(order)}
    rows = [(row[index], asserted, score) for index, asserted, score in records]
    values = []
    for replicate in weights:
        weight = np.array([replicate[r] for r, _, _ in rows])
        labels = np.array([a for _, a, _ in rows])
        kept = weight > 0
        if len(set(labels[kept])) < 2:
            values.append(np.nan)
            continue
        values.append(roc_auc_score(labels[kept], np.array([s for _, _, s in rows])[kept], sample_weight=weight[kept]))
    values = np.array(values)
    lower, upper = np.nanquantile(values[1:], [0.025, 0.975])
    return values[0], lower, upper


def test_denied_sentences_are_recognised_by_their_phrase_scores_with_an_interval(tmp_path):
    import lightning as L

    from xbench.reporting.writer import ResultsWriter

    root = recognition_release(tmp_path / "padchest-gr")
    dm = PadChestGR(root=str(root), num_workers=0, cache=False, image_size=FRAME, batch_size=3,
                    classes=["cardiomegaly", "nodule", "pneumothorax"])
    model = ScoresByText()
    trainer = L.Trainer(accelerator="cpu", logger=False, enable_progress_bar=False, enable_model_summary=False,
                        use_distributed_sampler=False, callbacks=[ResultsWriter(str(tmp_path / "results"), overlay_pairs=0)])
    trainer.test(model, datamodule=dm, verbose=False)
    found = model.results["phrase_grounding"]["sentence_recognition"]
    image_ids = dm.image_ids()
    for key in ("cardiomegaly", "nodule"):
        # each sentence's score from the release itself: its phrase's, shifted by its image's grey level
        shift = [10 * float(dm.test_set[index]["image"].double().mean()) for index in range(len(image_ids))]
        records = [(index, int(query.asserted), SCORES[query.text] + shift[index])
                   for index, sample in enumerate(dm.samples) for query in sample.queries if query.finding == key]
        estimate, lower, upper = brute_force_sentence_auroc(records, image_ids, found["replicates"], dm.name)
        result = found["per_finding"][key]
        assert result["auroc"]["estimate"] == pytest.approx(estimate, abs=1e-12), key
        assert (result["auroc"]["lower"], result["auroc"]["upper"]) == pytest.approx((lower, upper), abs=1e-12), key
        assert result["stated_sentences"] == sum(a for _, a, _ in records)
        assert result["denied_sentences"] == sum(1 - a for _, a, _ in records)
        assert 0 < estimate < 1 and lower < upper
    assert found["per_finding"]["pneumothorax"] == {"auroc": {"estimate": None, "lower": None, "upper": None},
                                                    "stated_sentences": 0, "denied_sentences": 0}
    # denied sentences are never graded: the queries' pairs are the stated sentences' only
    assert model.results["phrase_grounding"]["by_query"]["per_class"]["cardiomegaly"]["pairs"] == 4


def test_hi_ml_placement_also_leaves_denied_findings_ungraded(tmp_path):
    """hi-ml's protocol draws each query's boxes at native size: a denied finding draws nothing and is
    not graded, and the sentence scores do not depend on where the maps are placed."""
    import lightning as L

    root = recognition_release(tmp_path / "padchest-gr")
    found = {}
    for protocol in ("xbench", "hi-ml"):
        dm = PadChestGR(root=str(root), num_workers=0, cache=False, image_size=FRAME, batch_size=3,
                        classes=["cardiomegaly", "nodule"])
        model = ScoresByText(phrase_protocol=protocol)
        L.Trainer(accelerator="cpu", logger=False, enable_progress_bar=False, enable_model_summary=False,
                  use_distributed_sampler=False).test(model, datamodule=dm, verbose=False)
        found[protocol] = model.results["phrase_grounding"]
    assert found["hi-ml"]["protocol"] == "hi-ml"
    for key, pairs in (("cardiomegaly", 4), ("nodule", 3)):
        assert found["hi-ml"]["by_query"]["per_class"][key]["pairs"] == pairs
    assert found["hi-ml"]["sentence_recognition"] == found["xbench"]["sentence_recognition"]


def test_the_oracle_runs_on_the_default_config_through_the_command(release, tmp_path):
    """The shipped config end to end: every stated query hit, and the oracle's finding scores (it reads
    the labels) rank every stated sentence above every denied one."""
    main(run_args("oracle", "padchest_gr", release, tmp_path / "results", "--data.cache", "false", image_size=FRAME))
    results = json.loads((only_folder(tmp_path / "results") / "metrics.json").read_text())
    phrases = results["phrase_grounding"]
    assert phrases["query_mode"] == "finding" and results["data"]["notes"]["readers"] == "first"
    graded = {key: values for key, values in phrases["by_query"]["per_class"].items() if values["pairs"]}
    assert {key: values["pairs"] for key, values in graded.items()} == {
        "cardiomegaly": 1, "pleural_effusion": 2, "costophrenic_angle_blunting": 1, "nodule": 1, "scoliosis": 1}
    assert all(values["pointing_game"] == 1.0 for values in graded.values())
    recognition = phrases["sentence_recognition"]["per_finding"]
    assert recognition["cardiomegaly"] == {"auroc": {"estimate": 1.0, "lower": 1.0, "upper": 1.0},
                                           "stated_sentences": 1, "denied_sentences": 1}
    assert recognition["pleural_effusion"]["auroc"]["estimate"] == 1.0
    assert recognition["pneumothorax"]["stated_sentences"] == 0 and recognition["pneumothorax"]["denied_sentences"] == 1
