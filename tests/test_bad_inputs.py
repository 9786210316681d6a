"""Bad input through the real entry points: each gives a clear error that names what is wrong,
where, and the fix, and leaves no results folder behind."""

from __future__ import annotations

import json

import pytest

from conftest import run_args, write_chestx_det10
from xbench.test import main


def det10_root(tmp_path, entries):
    return write_chestx_det10(tmp_path / "det10", entries, size=48)


ENTRY = {"file_name": "a.png", "syms": ["Mass"], "boxes": [[4, 4, 20, 20]]}


def test_an_image_listed_twice_is_refused_naming_it(tmp_path):
    """Issue 23.3: evaluated twice, silently, before ("Images evaluated: 7" for 6 images)."""
    root = det10_root(tmp_path, [ENTRY, {"file_name": "b.png", "syms": [], "boxes": []}, ENTRY])
    with pytest.raises(ValueError, match=r"listed more than once.*a\.png.*entries 0, 2.*Keep one entry"):
        main(run_args("centre_prior", "chestx_det10", root, tmp_path / "results"))
    assert not (tmp_path / "results").exists() or not any((tmp_path / "results").iterdir())


def test_several_rows_of_one_image_still_merge(tmp_path):
    """The check is on images, not rows: ChestX-Det10 lists each image once with all its boxes."""
    two_boxes = {"file_name": "a.png", "syms": ["Mass", "Nodule"], "boxes": [[4, 4, 20, 20], [24, 24, 40, 40]]}
    root = det10_root(tmp_path, [two_boxes, {"file_name": "b.png", "syms": [], "boxes": []}])
    results = main(run_args("centre_prior", "chestx_det10", root, tmp_path / "results"))
    assert results["data"]["images_evaluated"] == 2
