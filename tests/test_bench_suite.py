"""``bench/suite.py``'s projection of the paper's suite, against the pairs counted one by one."""

from __future__ import annotations

import sys
from pathlib import Path

import pytest

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "bench"))
from suite import PHANTOM_CLASSES, ModelCost, job_seconds, project, wall_seconds  # noqa: E402


@pytest.mark.parametrize("mode", ["per-model", "per-pair"])
def test_projection_sums_every_pair(mode):
    models = [ModelCost("a", load=5.0, run=2.0, per_image=0.1), ModelCost("b", load=11.0, run=3.0, per_image=0.3)]
    datasets = {"x": (100, 1), "y": (40, 21), "z": (7, PHANTOM_CLASSES)}
    decode = {"x": 0.01, "y": 0.5, "z": 0.02}
    start, per_pair, workers = 9.0, 0.002, 2
    fixed = images = 0.0
    for model in models:
        fixed += start + model.load if mode == "per-model" else 0.0
        for n, classes in datasets.values():
            fixed += model.run + (start + model.load if mode == "per-pair" else 0.0)
            images += n * model.per_image + n * (classes - PHANTOM_CLASSES) * per_pair
    decoding = (100 * 0.01 + 40 * 0.5 + 7 * 0.02) / workers
    got = project(models, start, per_pair, decode, workers, mode, datasets)
    assert (got.fixed, got.images, got.decoding) == pytest.approx((fixed, images, decoding))
    assert got.total == pytest.approx(fixed + images + decoding)


def test_per_model_mode_saves_the_starts_and_loads_of_all_but_one_dataset_per_model():
    models = [ModelCost("a", load=5.0, run=2.0, per_image=0.1)]
    datasets = {name: (10, 1) for name in "uvwxyz"}
    args = (models, 9.0, 0.0, dict.fromkeys(datasets, 0.0), 1)
    saved = project(*args, "per-pair", datasets).fixed - project(*args, "per-model", datasets).fixed
    assert saved == pytest.approx(5 * (9.0 + 5.0))


@pytest.mark.parametrize("mode", ["per-model", "per-pair"])
def test_on_n_devices_the_jobs_start_longest_first_on_the_first_device_free(mode):
    models = [ModelCost("a", load=5.0, run=2.0, per_image=0.1), ModelCost("b", load=11.0, run=3.0, per_image=0.3),
              ModelCost("c", load=1.0, run=1.0, per_image=0.02)]
    datasets = {"x": (100, 1), "y": (40, 21)}
    args = (models, 9.0, 0.002, dict.fromkeys(datasets, 0.0), 1, mode, datasets)
    jobs = job_seconds(*args[:3], mode, datasets)
    assert len(jobs) == (3 if mode == "per-model" else 6)
    serial = project(*args)
    assert wall_seconds(jobs, 1) == pytest.approx(serial.fixed + serial.images)  # one device: the sum
    assert wall_seconds(jobs, len(jobs)) == max(jobs)  # a device each: the longest job
    # longest first: 5 and 4 start, 3 goes where 4 ends (7), 3 where 5 ends (8), 3 where 7 ends (10)
    assert wall_seconds([3.0, 5.0, 3.0, 4.0, 3.0], 2) == 10.0
