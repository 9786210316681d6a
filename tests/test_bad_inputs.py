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


def run_cli(args, capsys) -> tuple[int, str]:
    """``xbench-test`` in-process: its exit status and what it printed on stderr."""
    from xbench.cli import run

    with pytest.raises(SystemExit) as exit_info:
        run(lambda: main(args), "xbench-test")
    return exit_info.value.code, capsys.readouterr().err


@pytest.mark.parametrize(("option", "value", "status", "message"), [
    ("--data.image_size", "0", 1, "--data.image_size must be 2 to 4096 pixels, the side of the metric frame"),
    ("--data.image_size", "-5", 1, "--data.image_size must be 2 to 4096 pixels, the side of the metric frame"),
    ("--data.batch_size", "0", 1, "--data.batch_size must be positive; got 0"),
    ("--data.num_workers", "-1", 1, "--data.num_workers must be 0 (load in the main process) or more; got -1"),
    ("--data.mask_threshold", "0", 1, "--data.mask_threshold must be in (0, 1]; got 0"),
    ("--model.overlay_pairs", "-1", 1, "--model.overlay_pairs must be 0 or more; got -1"),
    ("--data.classes", "[nodule,bronchiectasis]", 1, "class 'bronchiectasis' is not a finding key"),
    # usage errors (a value of the wrong type, an unknown option): exit 2
    ("--model.upsample", "cubic", 2, "option 'upsample': Expected a typing.Literal['nearest', 'bilinear', "),
    ("--data.image_size", "abc", 2, "option 'image_size': Expected a <class 'int'>"),
    ("--data.nonsense", "3", 2, "Option 'nonsense' is not accepted"),
])
def test_a_bad_option_names_itself_in_one_line(phantom_root, tmp_path, capsys, option, value, status, message):
    """Issue 23.5/23.6: one message per option, no traceback and no jsonargparse dump."""
    code, err = run_cli(run_args("centre_prior", "phantom", phantom_root, tmp_path / "results", option, value),
                        capsys)
    assert code == status and message in err, err
    assert "Traceback" not in err and "NoneType" not in err and len(err.splitlines()) == 1, err
    assert not (tmp_path / "results").exists()


@pytest.mark.parametrize(("make", "message"), [
    (lambda root: None, "not found at"),
    (lambda root: ((root / "test_data").mkdir(parents=True), (root / "test.json").write_text("")), "test.json"),
    (lambda root: ((root / "test_data").mkdir(parents=True),
                   (root / "test.json").write_text('[{"file_name": "a.png", "syms"')), "test.json"),
])
def test_a_missing_or_broken_annotation_file_is_named(tmp_path, capsys, make, message):
    root = tmp_path / "det10"
    make(root)
    status, err = run_cli(run_args("centre_prior", "chestx_det10", root, tmp_path / "results"), capsys)
    assert status == 1 and message in err and "Traceback" not in err, err
    assert not (tmp_path / "results").exists()


def test_debug_shows_the_traceback(phantom_root, tmp_path, monkeypatch):
    monkeypatch.setenv("XBENCH_DEBUG", "1")
    from xbench.cli import run

    with pytest.raises(ValueError, match="image_size"):
        run(lambda: main(run_args("centre_prior", "phantom", phantom_root, tmp_path, "--data.image_size", "0")),
            "xbench-test")


@pytest.mark.parametrize(("boxes", "message"), [
    ("abc", "syms and boxes must be lists; got list and str"),
    ([[4, 4, "x", 20]], "is not [x1, y1, x2, y2]"),
])
def test_boxes_that_are_not_lists_of_numbers_are_refused(tmp_path, capsys, boxes, message):
    root = det10_root(tmp_path, [{"file_name": "a.png", "syms": ["Mass"], "boxes": [[4, 4, 20, 20]]}])
    (root / "test.json").write_text(json.dumps([{"file_name": "a.png", "syms": ["Mass"], "boxes": boxes}]))
    status, err = run_cli(run_args("centre_prior", "chestx_det10", root, tmp_path / "results"), capsys)
    assert status == 1 and message in err and "test.json, entry 0" in err, err


def test_an_empty_metrics_json_is_named_by_the_report(tmp_path, capsys):
    from xbench.cli import run
    from xbench.report import main as report_main

    folder = tmp_path / "results" / "clip__phantom__1"
    folder.mkdir(parents=True)
    (folder / "metrics.json").write_text("")
    with pytest.raises(SystemExit) as exit_info:
        run(lambda: report_main([str(tmp_path / "results"), "--out", str(tmp_path / "report")]), "xbench-report")
    err = capsys.readouterr().err
    assert exit_info.value.code == 1 and "metrics.json is empty" in err and "Traceback" not in err, err


def test_an_unwritable_results_dir_fails_before_the_run(phantom_root, tmp_path, capsys):
    """Issue 23.8: '/etc/passwd/results' failed after the whole run, and the results were lost."""
    blocker = tmp_path / "a_file"
    blocker.write_text("not a folder")
    status, err = run_cli(run_args("centre_prior", "phantom", phantom_root, blocker / "results"), capsys)
    assert status == 1 and f"--model.results_dir {blocker / 'results'} is not a folder XBench can write in" in err
    assert "Images evaluated" not in capsys.readouterr().out


def test_runs_finishing_in_the_same_second_get_their_own_folders(tmp_path):
    from xbench.reporting.results import claim_folder

    folders = []
    for n in range(3):
        staging = tmp_path / f".staging{n}"
        staging.mkdir()
        (staging / "metrics.json").write_text(str(n))
        folders.append(claim_folder(staging, tmp_path, "clip__phantom__20261123-120000"))
    assert [f.name for f in folders] == ["clip__phantom__20261123-120000", "clip__phantom__20261123-120000-1",
                                         "clip__phantom__20261123-120000-2"]
    assert [(f / "metrics.json").read_text() for f in folders] == ["0", "1", "2"]


def inspect(path, capsys) -> tuple[int, str]:
    from xbench.cli import run
    from xbench.inspect_checkpoint import main as inspect_main

    with pytest.raises(SystemExit) as exit_info:
        run(lambda: inspect_main([str(path)]), "xbench-inspect-checkpoint")
    return exit_info.value.code, capsys.readouterr().err


@pytest.mark.parametrize(("content", "message"), [
    (b"", "is empty (0 bytes): the download or copy did not finish"),
    (b"<html>Sign in</html>", "is not a PyTorch checkpoint (it starts with b'<h'"),
    (b"version https://git-lfs.github.com/spec/v1\n", "is not a PyTorch checkpoint"),
    (b"PK\x03\x04truncated", "cannot read checkpoint"),
])
def test_a_broken_checkpoint_says_what_it_is(tmp_path, capsys, content, message):
    """Issue 23.9: no 'please file an issue' from torch for a file that is not a checkpoint."""
    path = tmp_path / "model.pth"
    path.write_bytes(content)
    status, err = inspect(path, capsys)
    assert status == 1 and message in err and str(path) in err and "Traceback" not in err, err


def test_an_unpickling_attack_runs_nothing(tmp_path, capsys):
    import pickle

    marker = tmp_path / "ran"

    class Attack:
        def __reduce__(self):
            return (open, (str(marker), "w"))

    import torch

    path = tmp_path / "model.pth"
    torch.save({"model": {"w": torch.zeros(1)}, "payload": Attack()}, path, pickle_module=pickle)
    inspect(path, capsys)
    assert not marker.exists(), "loading executed code from the pickle"


def test_a_failed_drop_check_names_the_check_and_still_lists_the_other_keys(tmp_path):
    import torch
    from torch import nn

    from xbench.models.checkpoints import DeclaredDrop, has_shape, load_state_dict_strict

    state = {"weight": torch.zeros(2, 2), "bias": torch.zeros(2), "head.w": torch.zeros(3), "stray": torch.zeros(1)}
    with pytest.raises(ValueError) as error:
        load_state_dict_strict(nn.Linear(2, 3), state, file="m.pth",
                               drops=(DeclaredDrop("head.w", "a pre-training head", has_shape(4)),))
    text = str(error.value)
    assert "declared drop head.w (a pre-training head) failed its check: expected the shape [4]" in text
    assert "has shape [3]" in text and "stray" in text and "weight" in text  # the other differences too


def test_a_run_prints_no_wandb_anonymous_notice(phantom_root, tmp_path):
    """W&B prints it through its own printer, so no warnings filter hides it: the logger must not
    pass Lightning's ``anonymous=None`` on."""
    import os
    import subprocess
    import sys

    args = run_args("oracle", "phantom", phantom_root, tmp_path / "results", image_size=32)
    done = subprocess.run([sys.executable, "-m", "xbench.test", *args], capture_output=True, text=True,
                          timeout=300, cwd=tmp_path, env={**os.environ, "WANDB_MODE": "offline"})
    assert done.returncode == 0, done.stderr[-3000:]
    assert "anonymous setting" not in done.stdout + done.stderr


def test_report_on_runs_over_different_images_names_the_ids(phantom_root, tmp_path):
    """Issue 23.10: the report once said "got 5 folds for 4 images"; it says what xbench.analyze says."""
    from xbench.data.phantom import generate_phantom
    from xbench.report import main as report

    fewer = tmp_path / "fewer"
    generate_phantom(fewer, num_images=5, size=96, seed=3)
    for name, root in (("oracle", phantom_root), ("centre_prior", fewer)):
        main(run_args(name, "phantom", root, tmp_path / "results", "--trainer.logger", "false", image_size=32))
    with pytest.raises(ValueError, match=r"not on the same images.*image ids only in"):
        report([str(tmp_path / "results"), "--out", str(tmp_path / "report"), "--replicates", "20"])
    assert not (tmp_path / "report" / "report.md").exists()


def test_a_run_failing_while_writing_leaves_no_folder(phantom_root, tmp_path, monkeypatch):
    """A full disk while the results are written: no staged or half-written folder is left behind."""
    import xbench.reporting.results as results_module

    def full_disk(*args, **kwargs):
        raise OSError(28, "No space left on device")

    monkeypatch.setattr(results_module, "pair_table", full_disk)
    results = tmp_path / "results"
    with pytest.raises(OSError, match="No space left on device"):
        main(run_args("oracle", "phantom", phantom_root, results, "--trainer.logger", "false", image_size=32))
    assert list(results.iterdir()) == []


@pytest.mark.parametrize(("entries", "message"), [
    ('{"file_name": "a.png"}', "expected a JSON list of images"),
    ('[{"file_name": "a.png"}]', "entry 0"),
    ('[{"file_name": "a.png", "syms": ["Mass"], "boxes": [[20, 20, 4, 4]]}]', "entry 0"),
    ('[{"file_name": "a.png", "syms": ["Unicorn"], "boxes": [[4, 4, 20, 20]]}]', "'Unicorn'"),
    ('[{"file_name": "zz.png", "syms": [], "boxes": []}]', "zz.png"),
    ("   \n", "test.json"),
])
def test_a_bad_chestx_det10_entry_is_named(tmp_path, capsys, entries, message):
    root = det10_root(tmp_path, [ENTRY])
    (root / "test.json").write_text(entries)
    status, err = run_cli(run_args("centre_prior", "chestx_det10", root, tmp_path / "results"), capsys)
    assert status == 1 and message in err and "Traceback" not in err, err
    assert not (tmp_path / "results").exists()


def run_command(command_main, args, name, capsys) -> tuple[int, str]:
    """Any XBench command in-process through the one CLI wrapper: exit status and stderr."""
    from xbench.cli import run

    with pytest.raises(SystemExit) as exit_info:
        run(lambda: command_main(args), name)
    return exit_info.value.code, capsys.readouterr().err


@pytest.mark.parametrize(("model", "extra", "message"), [
    ("medklip", ("--model.checkpoint_dir", "nowhere/medklip"), "nowhere/medklip"),
    ("carzero", ("--model.checkpoint_dir", "nowhere/carzero"), "nowhere/carzero"),
    ("kad", ("--model.checkpoint_dir", "nowhere/kad"), "nowhere/kad"),
    ("gloria", ("--model.checkpoint_dir", "nowhere/gloria"), "nowhere/gloria"),
])
def test_a_missing_checkpoint_folder_is_named_with_the_fix(phantom_root, tmp_path, capsys, model, extra, message):
    status, err = run_cli(run_args(model, "phantom", phantom_root, tmp_path / "results", *extra), capsys)
    assert status == 1 and message in err and "checkpoints/README.md" in err and "Traceback" not in err, err
    assert not (tmp_path / "results").exists() or not any((tmp_path / "results").iterdir())


def test_an_unknown_model_class_is_a_usage_error(phantom_root, tmp_path, capsys):
    status, err = run_cli(run_args("centre_prior", "phantom", phantom_root, tmp_path / "results",
                                   "--model", "xbench.models.nothere.Model"), capsys)
    assert status == 2 and "xbench.models.nothere.Model" in err and "Traceback" not in err, err


def test_an_unknown_augmentation_is_named(phantom_root, tmp_path, capsys):
    status, err = run_cli(run_args("centre_prior", "phantom", phantom_root, tmp_path / "results",
                                   "--data.augment", '[{"name": "NoSuchTransform"}]'), capsys)
    assert status in (1, 2) and "NoSuchTransform" in err and "Traceback" not in err, err


def test_an_interrupted_run_stops_with_an_error_status_and_leaves_no_folder(phantom_root, tmp_path, capsys,
                                                                           monkeypatch):
    """Ctrl-C mid-run: Lightning shuts the run down and exits 1 (130 where the wrapper sees it)."""
    from xbench.models.baselines import CentrePrior

    def interrupt(self, image):
        raise KeyboardInterrupt

    monkeypatch.setattr(CentrePrior, "forward", interrupt)
    status, err = run_cli(run_args("centre_prior", "phantom", phantom_root, tmp_path / "results"), capsys)
    assert status in (1, 130)
    assert not (tmp_path / "results").exists() or not [p for p in (tmp_path / "results").iterdir()
                                                         if not p.name.startswith(".")]


@pytest.mark.parametrize(("command", "args", "message"), [
    ("suite", ["--config", "no_such_suite.yaml"], "no_such_suite.yaml"),
    ("report", ["no_such_results"], "no_such_results"),
    ("analyze", ["no_such_results"], "no_such_results"),
    ("inspect_checkpoint", ["no_such_file.pth"], "no_such_file.pth"),
])
def test_every_command_names_a_missing_input(tmp_path, capsys, monkeypatch, command, args, message):
    import importlib

    monkeypatch.chdir(tmp_path)
    module = importlib.import_module(f"xbench.{command}")
    status, err = run_command(module.main, args, f"xbench-{command}", capsys)
    assert status == 1 and message in err and "Traceback" not in err, err
