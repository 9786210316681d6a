"""Bad input through the real entry points: each gives a clear error that names what is wrong,
where, and the fix, and leaves no results folder behind."""

from __future__ import annotations

import json

import pytest

from conftest import reseal, run_args, write_chestx_det10
from xbench.test import main


def left_behind(folder) -> list[str]:
    """What a failed command left in ``folder`` (nothing, if it does not exist)."""
    return sorted(p.name for p in folder.iterdir()) if folder.exists() else []


def quiet_run(model, data, root, results, *extra, image_size=32):
    """:func:`run_args` for a small in-process run without a W&B run."""
    return run_args(model, data, root, results, "--trainer.logger", "false", *extra, image_size=image_size)


def assert_one_line(code: int, err: str, status: int, *named: str) -> None:
    """The command exited ``status`` with one error line (no traceback) that holds every ``named``."""
    assert code == status, err
    (line,) = [line for line in err.splitlines() if ": error: " in line]
    assert all(name in line for name in named), (named, err)
    assert "Traceback" not in err, err


def det10_root(tmp_path, entries):
    return write_chestx_det10(tmp_path / "det10", entries, size=48)


ENTRY = {"file_name": "a.png", "syms": ["Mass"], "boxes": [[4, 4, 20, 20]]}


def test_an_image_listed_twice_is_refused_naming_it(tmp_path):
    """Issue 23.3: evaluated twice, silently, before ("Images evaluated: 7" for 6 images)."""
    root = det10_root(tmp_path, [ENTRY, {"file_name": "b.png", "syms": [], "boxes": []}, ENTRY])
    with pytest.raises(ValueError, match=r"listed more than once.*a\.png.*entries 0, 2.*Keep one entry"):
        main(run_args("centre_prior", "chestx_det10", root, tmp_path / "results", "--trainer.logger", "false"))
    assert not (tmp_path / "results").exists() or not any((tmp_path / "results").iterdir())


def test_several_rows_of_one_image_still_merge(tmp_path):
    """The check is on images, not rows: ChestX-Det10 lists each image once with all its boxes."""
    two_boxes = {"file_name": "a.png", "syms": ["Mass", "Nodule"], "boxes": [[4, 4, 20, 20], [24, 24, 40, 40]]}
    root = det10_root(tmp_path, [two_boxes, {"file_name": "b.png", "syms": [], "boxes": []}])
    results = main(run_args("centre_prior", "chestx_det10", root, tmp_path / "results", "--trainer.logger", "false",
                            image_size=32))
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
    ("--results.overlay_pairs", "-1", 1, "--results.overlay_pairs must be 0 or more; got -1"),
    ("--data.classes", "[nodule,bronchiectasis]", 1, "class 'bronchiectasis' is not a finding key"),
    # usage errors (a value of the wrong type, an unknown option): exit 2
    ("--model.upsample", "cubic", 2, "option 'upsample': Expected a typing.Literal['nearest', 'bilinear', "),
    ("--data.image_size", "abc", 2, "option 'image_size': Expected a <class 'int'>"),
    ("--data.nonsense", "3", 2, "Option 'nonsense' is not accepted"),
])
def test_a_bad_option_names_itself_in_one_line(phantom_root, tmp_path, capsys, option, value, status, message):
    """Issue 23.5/23.6: one message per option, no traceback and no jsonargparse dump."""
    code, err = run_cli(quiet_run("centre_prior", "phantom", phantom_root, tmp_path / "results", option, value),
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
    status, err = run_cli(quiet_run("centre_prior", "chestx_det10", root, tmp_path / "results"), capsys)
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
    status, err = run_cli(quiet_run("centre_prior", "chestx_det10", root, tmp_path / "results"), capsys)
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
    status, err = run_cli(quiet_run("centre_prior", "phantom", phantom_root, blocker / "results"), capsys)
    assert status == 1 and f"--results.folder {blocker / 'results'} is not a folder XBench can write in" in err
    assert "Images evaluated" not in capsys.readouterr().out


def test_runs_finishing_in_the_same_second_get_their_own_folders(tmp_path):
    from xbench.results.write import claim_folder

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


def test_a_run_prints_no_third_party_notice(phantom_root, tmp_path, capfd):
    """W&B prints through its own printer (on the process's stderr, which capfd reads), so no
    warnings filter hides it: the logger must not pass Lightning's ``anonymous=None`` on, and the
    command's logger is silent (W&B's three lines per run; the summary says where the run went), also
    when an earlier W&B run of the process has fixed W&B's environment settings.
    Lightning's "Seed set to 0" and device lines are INFO of loggers the command quiets (issue 32)."""
    from xbench.cli import run

    with pytest.raises(SystemExit) as exit_info:
        run(lambda: main(run_args("oracle", "phantom", phantom_root, tmp_path / "results", image_size=32)), "xbench-test")
    out, err = capfd.readouterr()
    assert exit_info.value.code == 0, err[-3000:]
    for notice in ("anonymous setting", "wandb:", "Seed set to", "GPU available", "LeafSpec", "litlogger"):
        assert notice not in out + err, (notice, out + err)
    assert "W&B run saved offline in" in out


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
    status, err = run_cli(quiet_run("centre_prior", "chestx_det10", root, tmp_path / "results"), capsys)
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
    status, err = run_cli(quiet_run(model, "phantom", phantom_root, tmp_path / "results", *extra), capsys)
    assert status == 1 and message in err and "checkpoints/README.md" in err and "Traceback" not in err, err
    assert not (tmp_path / "results").exists() or not any((tmp_path / "results").iterdir())


def test_an_unknown_model_class_is_a_usage_error(phantom_root, tmp_path, capsys):
    status, err = run_cli(quiet_run("centre_prior", "phantom", phantom_root, tmp_path / "results",
                                   "--model", "xbench.models.nothere.Model"), capsys)
    assert status == 2 and "xbench.models.nothere.Model" in err and "Traceback" not in err, err


def test_an_unknown_augmentation_is_named(phantom_root, tmp_path, capsys):
    status, err = run_cli(quiet_run("centre_prior", "phantom", phantom_root, tmp_path / "results",
                                   "--data.augment", '[{"name": "NoSuchTransform"}]'), capsys)
    assert status in (1, 2) and "NoSuchTransform" in err and "Traceback" not in err, err


def test_an_interrupted_run_stops_with_an_error_status_and_leaves_no_folder(phantom_root, tmp_path, capsys,
                                                                           monkeypatch):
    """Ctrl-C mid-run: Lightning shuts the run down and exits 1 (130 where the wrapper sees it)."""
    from xbench.models.baselines import CentrePrior

    def interrupt(self, image):
        raise KeyboardInterrupt

    monkeypatch.setattr(CentrePrior, "forward", interrupt)
    status, err = run_cli(quiet_run("centre_prior", "phantom", phantom_root, tmp_path / "results"), capsys)
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


# =============================================================================================
# The catalogue of issue 30: every number is checked where it is born, every message names its
# file, row, pair or option and says the fix, and no failed run leaves a results folder.
# =============================================================================================

# -- the unpickler admits data only -----------------------------------------------------------

import pickle as _pickle  # noqa: E402

from xbench.models import safe_pickle  # noqa: E402
from xbench.models.safe_pickle import ALLOWED_GLOBALS, load_data_pickle  # noqa: E402


def _text(value: str) -> bytes:
    return _pickle.SHORT_BINUNICODE + bytes([len(value)]) + value.encode()


def _attacks(module: str, name: str) -> dict[str, bytes]:
    """Pickles that try to change the allowed global ``module.name`` (or what calling it returns)."""
    g = _pickle.GLOBAL + f"{module}\n{name}\n".encode()
    planted = _text("planted") + _pickle.NONE
    bodies = {
        "BUILD into __dict__": g + _pickle.EMPTY_DICT + planted + _pickle.SETITEM + _pickle.BUILD,
        "BUILD setattr __defaults__": g + _pickle.NONE + _pickle.EMPTY_DICT + _text("__defaults__") + _pickle.NONE
        + _pickle.TUPLE1 + _pickle.SETITEM + _pickle.TUPLE2 + _pickle.BUILD,
        "SETITEM": g + planted + _pickle.SETITEM,
        "SETITEMS": g + _pickle.MARK + planted + _pickle.SETITEMS,
        "APPEND": g + _pickle.NONE + _pickle.APPEND,
        "APPENDS": g + _pickle.MARK + _pickle.NONE + _pickle.APPENDS,
        "ADDITEMS": g + _pickle.MARK + _pickle.NONE + _pickle.ADDITEMS,
        "REDUCE, then BUILD on the result": g + _pickle.EMPTY_TUPLE + _pickle.REDUCE + _pickle.EMPTY_DICT + planted
        + _pickle.SETITEM + _pickle.BUILD,
        "REDUCE with itself": g + g + _pickle.TUPLE1 + _pickle.REDUCE,
        "NEWOBJ": g + _pickle.EMPTY_TUPLE + _pickle.NEWOBJ,
        "OBJ": _pickle.MARK + g + _pickle.OBJ,
        "INST": _pickle.MARK + _pickle.INST + f"{module}\n{name}\n".encode(),
        "a shared dtype, then BUILD": _pickle.GLOBAL + b"numpy\ndtype\n" + _text("f8") + _pickle.NEWFALSE
        + _pickle.NEWFALSE + _pickle.TUPLE3 + _pickle.REDUCE + _pickle.MARK + _pickle.BININT1 + b"\x03" + _text(">")
        + _pickle.NONE * 3 + _pickle.BININT + (-1).to_bytes(4, "little", signed=True) * 2 + _pickle.BININT1 + b"\x00"
        + _pickle.TUPLE + _pickle.BUILD,
        "an object dtype": _pickle.GLOBAL + b"numpy\ndtype\n" + _text("O") + _pickle.NEWFALSE + _pickle.NEWTRUE
        + _pickle.TUPLE3 + _pickle.REDUCE,
    }
    return {kind: _pickle.PROTO + b"\x04" + body + _pickle.STOP for kind, body in bodies.items()}


def _world() -> dict:
    """What a pickle must not change: every allowed global's and original's attributes and defaults,
    the modules they live in, and NumPy's shared dtypes."""
    import collections
    import sys

    import numpy as np
    import torch

    objects = [collections.OrderedDict, torch._utils._rebuild_tensor_v2, torch._utils._rebuild_tensor,
               torch.storage._load_from_bytes, np.ndarray, np.dtype, *ALLOWED_GLOBALS.values(), *safe_pickle.BUILDERS]
    state = {}
    for obj in objects:
        attributes = {k: id(v) for k, v in vars(obj).items()} if hasattr(obj, "__dict__") else None
        state[repr(obj)] = (getattr(obj, "__defaults__", None), getattr(obj, "__kwdefaults__", None), attributes)
    for name in ("collections", "torch", "torch._utils", "torch.storage", "numpy", "numpy._core.multiarray",
                 "numpy._core.numeric", "xbench.models.safe_pickle", "_codecs", "builtins"):
        state[name] = {k: id(v) for k, v in vars(sys.modules[name]).items()}
    state["dtypes"] = [(code, np.dtype(code).str, np.dtype(code).isnative) for code in "?bhilqefdFD"]
    return state


def _changed(before: dict, after: dict) -> list[str]:
    changed = []
    for key, value in before.items():
        if isinstance(value, dict):  # a module: no name removed or rebound (lazy imports may add names)
            changed += [f"{key}.{name}" for name in value if after[key].get(name) != value[name]]
        elif after[key] != value:
            changed.append(key)
    return changed


def _load_attacks(path, allowed):
    """Load each attack on ``allowed`` from ``path``, yielding its kind after the load: a refusal
    must name the file."""
    for kind, payload in _attacks(*allowed).items():
        path.write_bytes(payload)
        try:
            load_data_pickle(path)
        except _pickle.UnpicklingError as error:
            assert str(error).startswith(str(path)), (kind, error)
        yield kind


@pytest.mark.parametrize("allowed", sorted(ALLOWED_GLOBALS), ids=lambda key: ".".join(key))
def test_no_pickle_changes_anything_outside_what_it_returns(tmp_path, allowed):
    """Issue 30.4: BUILD, SETITEM(S), APPEND(S), ADDITEMS, REDUCE, NEWOBJ, OBJ and INST on every
    allowed global, and on what calling it returns, are refused or stay inside the returned object."""
    before = _world()
    for kind in _load_attacks(tmp_path / "attack_Cardiomegaly_map.pkl", allowed):
        assert _changed(before, _world()) == [], kind


def test_the_twenty_byte_pickle_negates_no_later_tensor(tmp_path):
    """Issue 30.3: ``c torch._utils _rebuild_tensor_v2`` + BUILD of ``__defaults__ = ({'neg': True},)``
    used to negate every tensor loaded after it, ``torch.load(weights_only=True)`` included."""
    import torch

    attack = (_pickle.PROTO + b"\x04" + _pickle.GLOBAL + b"torch._utils\n_rebuild_tensor_v2\n" + _pickle.NONE
              + _pickle.EMPTY_DICT + _text("__defaults__") + _pickle.EMPTY_DICT + _text("neg") + _pickle.NEWTRUE
              + _pickle.SETITEM + _pickle.TUPLE1 + _pickle.SETITEM + _pickle.TUPLE2 + _pickle.BUILD + _pickle.STOP)
    (tmp_path / "a_Edema_map.pkl").write_bytes(attack)
    with pytest.raises(_pickle.UnpicklingError, match=r"a_Edema_map\.pkl: the pickle sets the state of function"):
        load_data_pickle(tmp_path / "a_Edema_map.pkl")
    torch.save(torch.tensor([1.0, 2.0]), tmp_path / "t.pt")
    assert torch.load(tmp_path / "t.pt", weights_only=True).tolist() == [1.0, 2.0]
    (tmp_path / "b_Edema_map.pkl").write_bytes(_pickle.dumps({"map": torch.tensor([[3.0]]), "prob": 0.5}))
    assert load_data_pickle(tmp_path / "b_Edema_map.pkl")["map"].tolist() == [[3.0]]


# -- saved maps and boxes: exact shapes, finite numbers, sizes of the image's aspect -----------

#: A ChestX-Det10 fixture with non-square images (48 wide, 32 high), so that [w, h] shows.
SAVED_SIZE = (32, 48)


@pytest.fixture(scope="module")
def wide_det10(tmp_path_factory):
    import numpy as np
    from PIL import Image

    root = tmp_path_factory.mktemp("wide") / "det10"
    (root / "test_data").mkdir(parents=True)
    for name in ("a.png", "b.png"):
        Image.fromarray(np.full(SAVED_SIZE, 90, np.uint8)).save(root / "test_data" / name)
    entries = [{"file_name": "a.png", "syms": ["Mass"], "boxes": [[4, 4, 20, 20]]},
               {"file_name": "b.png", "syms": ["Nodule"], "boxes": [[20, 10, 30, 20]]}]
    (root / "test.json").write_text(json.dumps(entries))
    return root


CLASSES = ["mass", "nodule"]


def saved_samples(root):
    from xbench.data.chestx_det10 import ChestXDet10

    return ChestXDet10(root=str(root), classes=CLASSES).samples


def read_every_pair(path, layout, root, classes=CLASSES):
    """Every pair of the fixture through PrecomputedSaliency, as a run reads them (with the
    images' native size, as the batch gives it)."""
    from xbench.models.precomputed import PrecomputedSaliency

    model = PrecomputedSaliency(str(path), layout=layout)
    samples = saved_samples(root)
    model.find_pairs(samples, list(classes))
    return [model.frame_map(sample.image_id, key, (8, 8), SAVED_SIZE) for sample in samples for key in classes]


def good_image(**changes):
    import numpy as np

    arrays = {"maps": np.random.default_rng(0).random((2, 4, 6), dtype=np.float32), "logits": np.zeros(2)}
    return {**arrays, **changes}


NAN_MAPS = good_image()["maps"].copy()
NAN_MAPS[1, 2, 3] = float("nan")

PER_IMAGE_CASES = {
    "maps [C, w]": (dict(maps=good_image()["maps"][:, 0]), "maps has shape [2, 6]; expected [C, h, w] = [2, h, w]"),
    "maps 1-D": (dict(maps=good_image()["maps"].ravel()), "maps has shape [48]; expected [C, h, w]"),
    "maps [C, 1, h, w]": (dict(maps=good_image()["maps"][:, None]), "maps has shape [2, 1, 4, 6]; expected"),
    "maps of another class count": (dict(maps=good_image()["maps"][:1]), "maps has shape [1, 4, 6]; expected"),
    "maps of height 0": (dict(maps=good_image()["maps"][:, :0]), "maps has shape [2, 0, 6]; expected"),
    "NaN in a map": (dict(maps=NAN_MAPS), "(a.png, nodule): the map holds 1 NaN or infinite values"),
    "infinite map": (dict(maps=good_image()["maps"] * float("inf")), "(a.png, mass): the map holds"),
    "NaN logit": (dict(logits=[0.0, float("nan")]), "(a.png, nodule): logits is nan; save a finite logit"),
    "logits of another length": (dict(logits=[0.0, 0.0, 0.0]), "logits has shape [3]; expected [2]"),
    "probability above 1": (dict(logits=None, probs=[0.2, 1.5]), "probs is 1.5; a probability lies in [0, 1]"),
    "window of height 0": (dict(window=[0, 0, 0, 48], image_size=[32, 48]), "window must be [top, left, height, width]"),
    "NaN window": (dict(window=[0, float("nan"), 32, 48], image_size=[32, 48]), "with height and width > 0"),
    "image_size [0, 0]": (dict(window=[0, 0, 32, 48], image_size=[0, 0]), "image_size [height, width] must be two whole"),
    "negative image_size": (dict(window=[0, 0, 32, 48], image_size=[-32, 48]), "got [-32, 48]"),
    "fractional image_size": (dict(window=[0, 0, 32, 48], image_size=[32.5, 48]), "got [32.5, 48.0]"),
    "image_size written [w, h]": (dict(window=[0, 0, 48, 32], image_size=[48, 32]),
                                  "it reads as [width, height]: write [height, width]"),
    "image_size of another aspect": (dict(window=[0, 0, 32, 32], image_size=[32, 32]),
                                     "the stated image size [32, 32] (height, width) has another aspect ratio"),
    "window without image_size": (dict(window=[0, 0, 32, 48]), "needs the native image_size [height, width]"),
    "no maps": (dict(maps=None), "no 'maps' array; a per-image file holds maps [C, h, w]"),
    "classes repeated": (dict(classes=["mass", "nodule", "mass"], maps=good_image()["maps"][[0, 1, 1]],
                              logits=[0.0, 0.0, 0.0]), "its classes repeat a finding"),
    "maps of text": (dict(maps=["a", "b"]), "cannot be read as an .npz archive"),
}


@pytest.mark.parametrize("case", PER_IMAGE_CASES)
def test_a_bad_per_image_file_is_named_with_its_shape(wide_det10, tmp_path, case):
    import numpy as np

    changes, message = PER_IMAGE_CASES[case]
    np.savez(tmp_path / "b.png.npz", **good_image())
    arrays = {k: v for k, v in good_image(**changes).items() if v is not None}
    np.savez(tmp_path / "a.png.npz", **arrays)
    with pytest.raises((ValueError, KeyError)) as error:
        read_every_pair(tmp_path, "per_image", wide_det10)
    assert str(tmp_path / "a.png.npz") in str(error.value) and message in str(error.value), str(error.value)


def test_a_proportional_image_size_is_taken(wide_det10, tmp_path):
    """A size stated for a resized copy (the same aspect, up to a pixel's rounding) is no error."""
    import numpy as np

    for name in ("a.png", "b.png"):
        np.savez(tmp_path / f"{name}.npz", **good_image(window=[0, 0, 1000, 1501], image_size=[1000, 1501]))
    assert len(read_every_pair(tmp_path, "per_image", wide_det10)) == 4


@pytest.mark.parametrize(("content", "message"), [
    (b"", "cannot be read as an .npz archive"),
    (b"PK\x03\x04 not really a zip", "cannot be read as an .npz archive"),
    (bytes(range(256)) * 4, "cannot be read as an .npz archive"),
])
def test_a_damaged_per_image_file_is_named(wide_det10, tmp_path, content, message):
    (tmp_path / "a.png.npz").write_bytes(content)
    with pytest.raises(ValueError, match=message) as error:
        read_every_pair(tmp_path, "per_image", wide_det10)
    assert str(tmp_path / "a.png.npz") in str(error.value)


def test_a_corrupt_safetensors_header_is_named(wide_det10, tmp_path):
    (tmp_path / "a.png.safetensors").write_bytes((10**6).to_bytes(8, "little") + b'{"maps": ')
    with pytest.raises(ValueError, match="cannot be read as a .safetensors file") as error:
        read_every_pair(tmp_path, "per_image", wide_det10)
    assert str(tmp_path / "a.png.safetensors") in str(error.value)


PER_PAIR_CASES = {
    "map [1, h, w]": (dict(map=[[[0.0, 1.0]]]), "map map has shape [1, 1, 2]; expected [h, w]"),
    "1-D map": (dict(map=[0.0, 1.0]), "map map has shape [2]; expected [h, w]"),
    "empty map": (dict(map=[[]]), "map map has shape [1, 0]; expected [h, w] with h, w >= 1"),
    "two logits": (dict(logit=[0.0, 1.0]), "logit has shape [2]; expected one number"),
    "NaN probability": (dict(logit=None, prob=float("nan")), "prob is nan; a probability lies in [0, 1]"),
    "no score": (dict(logit=None), "no 'logit' or 'prob'"),
    "window of width 0": (dict(window=[0, 0, 32, 0], image_size=[32, 48]), "with height and width > 0"),
}


@pytest.mark.parametrize("case", PER_PAIR_CASES)
def test_a_bad_per_pair_file_is_named_with_its_shape(wide_det10, tmp_path, case):
    import numpy as np

    changes, message = PER_PAIR_CASES[case]
    for image in ("a.png", "b.png"):
        for key in CLASSES:
            arrays = {"map": np.ones((3, 5), np.float32) * np.arange(5), "logit": np.float32(0.5)}
            if (image, key) == ("a.png", "nodule"):
                arrays = {k: v for k, v in {**arrays, **changes}.items() if v is not None}
            (tmp_path / image).mkdir(exist_ok=True)
            np.savez(tmp_path / image / f"{key}.npz", **{k: np.asarray(v) for k, v in arrays.items()})
    with pytest.raises((ValueError, KeyError)) as error:
        read_every_pair(tmp_path, "per_pair", wide_det10)
    assert f"{tmp_path / 'a.png' / 'nodule.npz'} (a.png, nodule)" in str(error.value), str(error.value)
    assert message in str(error.value), str(error.value)


#: Findings both ChestX-Det10 and cheXlocalize's pickles name.
PICKLED = ["atelectasis", "consolidation"]
CHEXLOCALIZE_CASES = {
    "map [1, 1, h]": (dict(map="3-D"), "map has shape [1, 1, 4]; expected [1, 1, h, w]"),
    "map [2, 1, h, w]": (dict(map="two"), "map has shape [2, 1, 4, 6]; expected [1, 1, h, w]"),
    "cxr_dims [0, 0]": (dict(cxr_dims=(0, 0)), "cxr_dims (width, height) must be two whole numbers of pixels >= 1"),
    "cxr_dims written (height, width)": (dict(cxr_dims=SAVED_SIZE), "it reads as [width, height]"),
    "NaN probability": (dict(prob=float("nan")), "prob is nan; a probability lies in [0, 1]"),
    "14 probabilities for an unknown task": (dict(prob="14", task="Unicorn"), "14 probabilities need the task"),
    "not a dict": (dict(whole=[1, 2]), "expected cheXlocalize's dict with map, prob and cxr_dims"),
}


@pytest.mark.parametrize("case", CHEXLOCALIZE_CASES)
def test_a_bad_chexlocalize_pickle_is_named(wide_det10, tmp_path, case):
    import torch

    changes, message = CHEXLOCALIZE_CASES[case]
    for image in ("a", "b"):
        for pathology in ("Atelectasis", "Consolidation"):
            info = {"map": torch.rand(1, 1, 4, 6), "prob": 0.3, "task": pathology, "cxr_dims": SAVED_SIZE[::-1]}
            if (image, pathology) == ("a", "Consolidation"):
                maps = {"3-D": info["map"][..., 0], "two": torch.cat([info["map"]] * 2)}
                info.update(changes)
                info["map"] = maps.get(info["map"], info["map"]) if isinstance(info["map"], str) else info["map"]
                info["prob"] = torch.full((14,), 0.5) if info["prob"] == "14" else info["prob"]
                info = info.get("whole", info)
            (tmp_path / f"{image}.png_{pathology}_map.pkl").write_bytes(_pickle.dumps(info))
    with pytest.raises(ValueError) as error:
        read_every_pair(tmp_path, "chexlocalize", wide_det10, PICKLED)
    assert str(tmp_path / "a.png_Consolidation_map.pkl") in str(error.value) and message in str(error.value), \
        str(error.value)


def test_a_random_bytes_pickle_is_named(wide_det10, tmp_path):
    for image in ("a", "b"):
        (tmp_path / f"{image}.png_Atelectasis_map.pkl").write_bytes(bytes(range(7, 200)))
    with pytest.raises(_pickle.UnpicklingError, match="is not a readable pickle") as error:
        read_every_pair(tmp_path, "chexlocalize", wide_det10, PICKLED[:1])
    assert str(tmp_path / "a.png_Atelectasis_map.pkl") in str(error.value)


BOX_LINE = {"image_id": "a.png", "finding": "mass", "image_size": list(SAVED_SIZE), "boxes": [[4, 4, 20, 20]],
            "logit": 0.5}
BOX_CASES = {
    "NaN coordinate": ('"boxes": [[4, NaN, 20, 20]]', "boxes must be [x1, y1, x2, y2], finite"),
    "coordinate 1e400": ('"boxes": [[4, 4, 1e400, 20]]', "boxes must be [x1, y1, x2, y2], finite"),
    "inverted box": ('"boxes": [[20, 4, 4, 20]]', "with x1 <= x2 and y1 <= y2"),
    "image_size [0, 0]": ('"image_size": [0, 0]', "image_size [height, width] must be two whole numbers"),
    "image_size [-64, 64]": ('"image_size": [-64, 64]', "got [-64, 64]"),
    "image_size written [w, h]": ('"image_size": [48, 32]', "it reads as [width, height]: write [height, width]"),
    "image_size of another aspect": ('"image_size": [100, 100]', "has another aspect ratio than the image"),
    "NaN score": ('"scores": [NaN]', "scores must be one finite number per box"),
    "infinite logit": ('"logit": 1e400', "logit is inf; save a finite logit"),
    "probability 2": ('"prob": 2', "prob is 2.0; a probability lies in [0, 1]"),
    "image_size of one number": ('"image_size": [32]', "image_size [height, width] must be two whole numbers"),
}


@pytest.mark.parametrize("case", BOX_CASES)
def test_a_bad_box_line_is_named_with_file_and_line(wide_det10, tmp_path, case):
    change, message = BOX_CASES[case]
    good = [json.dumps({**BOX_LINE, "image_id": image, "finding": key}) for image in ("a.png", "b.png")
            for key in CLASSES]
    key = change.split(":")[0].strip('"')
    line = {**BOX_LINE, "image_id": "b.png", "finding": "nodule"}
    bad = json.dumps({k: v for k, v in line.items() if not (key == "prob" and k == "logit")})
    bad = bad.replace("}", ", " + change + "}") if key not in line else bad.replace(
        f'"{key}": {json.dumps(line[key])}', change)
    (tmp_path / "boxes.jsonl").write_text("\n".join([*good[:3], bad]) + "\n")
    with pytest.raises(ValueError) as error:
        read_every_pair(tmp_path / "boxes.jsonl", "boxes", wide_det10)
    assert f"{tmp_path / 'boxes.jsonl'}, line 4" in str(error.value) and message in str(error.value), str(error.value)


def test_a_non_utf8_box_file_is_named(wide_det10, tmp_path):
    (tmp_path / "boxes.jsonl").write_bytes(json.dumps(BOX_LINE).encode() + b"\n\xff\xfe\n")
    with pytest.raises(ValueError, match="is not UTF-8 text") as error:
        read_every_pair(tmp_path / "boxes.jsonl", "boxes", wide_det10)
    assert str(tmp_path / "boxes.jsonl") in str(error.value)


def write_saved(kind, folder, wide_det10):
    """Saved outputs for every pair of the wide fixture, one of them bad (``kind``)."""
    import numpy as np

    if kind == "boxes [w, h]":
        lines = [{**BOX_LINE, "image_id": image, "finding": key} for image in ("a.png", "b.png") for key in CLASSES]
        lines[-1]["image_size"] = list(SAVED_SIZE[::-1])
        (folder / "boxes.jsonl").write_text("".join(json.dumps(line) + "\n" for line in lines))
        return ["--config", str(CONFIGS_DIR / "models" / "precomputed_boxes.yaml"),
                "--model.path", str(folder / "boxes.jsonl")], f"{folder / 'boxes.jsonl'}, line 4"
    maps = {"a.png": good_image(), "b.png": good_image(maps=NAN_MAPS) if kind == "NaN map" else
            good_image(window=[0, 0, 0, 48], image_size=[32, 48])}
    for image, arrays in maps.items():
        np.savez(folder / f"{image}.npz", **arrays)
    return ["--config", str(CONFIGS_DIR / "models" / "precomputed_per_image.yaml"), "--model.path", str(folder)], \
        f"{folder / 'b.png.npz'} (b.png, "


from conftest import CONFIGS as CONFIGS_DIR  # noqa: E402


@pytest.mark.parametrize("kind", ["NaN map", "window of height 0", "boxes [w, h]"])
def test_a_run_on_bad_saved_outputs_stops_naming_the_file_and_pair(wide_det10, tmp_path, capsys, kind):
    """Issue 30.2/30.4: the CLI's whole path, not only the reader: exit 1, one line, no folder."""
    saved = tmp_path / "saved"
    saved.mkdir()
    extra, named = write_saved(kind, saved, wide_det10)
    args = quiet_run("centre_prior", "chestx_det10", wide_det10, tmp_path / "results", "--data.classes",
                     "[mass,nodule]")
    code, err = run_cli([*args, *extra], capsys)
    assert_one_line(code, err, 1, named)
    assert left_behind(tmp_path / "results") == []


# -- DICOM: a degenerate modality or VOI transform is an error naming the file -----------------

def _lut(descriptor, data):
    from pydicom.dataset import Dataset
    from pydicom.sequence import Sequence

    item = Dataset()
    item.LUTDescriptor = descriptor
    item.add_new("LUTData", "US", data)
    return Sequence([item])


DICOM_CASES = {
    "Rescale Slope 0": (dict(RescaleSlope=0, RescaleIntercept=0), "Rescale Slope (0028,1053) is 0.0"),
    "Rescale Slope NaN": (dict(RescaleSlope="nan", RescaleIntercept=0), "Rescale Slope (0028,1053) is nan"),
    "Rescale Intercept infinite": (dict(RescaleSlope=1, RescaleIntercept="inf"), "Rescale Intercept (0028,1052) is inf"),
    "Window Width 0": (dict(WindowCenter=100, WindowWidth=0), "Window Width (0028,1051) is 0.0"),
    "Window Width negative": (dict(WindowCenter=100, WindowWidth=-5), "Window Width (0028,1051) is -5.0"),
    "Window Center NaN": (dict(WindowCenter="nan", WindowWidth=10), "Window Center (0028,1050) is nan"),
    "VOI LUT of 0 bits": (dict(VOILUTSequence=lambda: _lut([4, 0, 0], [1, 2, 3, 4])), "VOILUTSequence holds no usable"),
    "VOI LUT without data": (dict(VOILUTSequence=lambda: _lut([4, 0, 8], [])), "VOILUTSequence holds no usable LUT"),
    "Modality LUT of 0 bits": (dict(ModalityLUTSequence=lambda: _lut([4, 0, 0], [1, 2, 3, 4])),
                               "ModalityLUTSequence holds no usable LUT"),
}


@pytest.mark.parametrize("case", DICOM_CASES)
def test_a_degenerate_dicom_transform_is_named(tmp_path, case):
    import warnings

    import numpy as np

    from conftest import write_dicom
    from xbench.data.io import ImageReadError, read_image

    elements, message = DICOM_CASES[case]
    elements = {k: v() if callable(v) else v for k, v in elements.items()}
    path = tmp_path / "x.dcm"
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")  # pydicom warns that "nan" is no valid DS
        write_dicom(path, (np.arange(48 * 40).reshape(40, 48) % 4096).astype(np.uint16), BitsStored=12, **elements)
        with pytest.raises(ImageReadError) as error:
            read_image(path)
    assert f"DICOM {path}: " in str(error.value) and message in str(error.value), str(error.value)
    assert "correct the file's header" in str(error.value)


def test_a_run_on_a_dicom_with_slope_0_stops_naming_it(tmp_path, capsys):
    """Issue 30.2: the all-NaN image used to be cached as black and read by every model."""
    import numpy as np

    from conftest import write_dicom

    root = tmp_path / "rsna"
    (root / "stage_2_train_labels.csv").parent.mkdir(parents=True)
    (root / "stage_2_train_labels.csv").write_text("patientId,x,y,width,height,Target\np1,4,4,20,20,1\np2,,,,,0\n")
    pixels = np.random.default_rng(0).integers(0, 256, (40, 40), dtype=np.uint8)
    write_dicom(root / "p1.dcm", pixels)
    write_dicom(root / "p2.dcm", pixels, RescaleSlope=0, RescaleIntercept=0)
    code, err = run_cli(quiet_run("centre_prior", "rsna", root, tmp_path / "results", "--data.split_file", "null"),
                        capsys)
    assert_one_line(code, err, 1, f"DICOM {root / 'p2.dcm'}: Rescale Slope (0028,1053) is 0.0")
    assert left_behind(tmp_path / "results") == []


# -- loaders: every annotation file read as UTF-8 with its name in the error; boxes checked -----

def _png(path, size):
    import numpy as np
    from PIL import Image

    path.parent.mkdir(parents=True, exist_ok=True)
    Image.fromarray(np.zeros(size[::-1], np.uint8)).save(path)


def _non_utf8(path, header: str):
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_bytes(header.encode() + b"\n\xff\xfe broken \xc3\x28\n")
    return path


def _vindr_labels(root, rows):
    from xbench.findings import SPELLINGS

    columns = list(SPELLINGS["vindr"]) + ["COPD", "Lung tumor", "Pneumonia", "Tuberculosis", "Other disease",
                                          "No finding"]
    (root / "annotations").mkdir(parents=True, exist_ok=True)
    (root / "annotations" / "image_labels_test.csv").write_text(
        ",".join(["image_id", *columns]) + "\n" + "".join(",".join([image] + ["0"] * len(columns)) + "\n"
                                                          for image in rows))


NON_UTF8 = {
    "chestx_det10": ("xbench.data.chestx_det10.ChestXDet10", "test.json",
                     lambda root: ((root / "test_data").mkdir(parents=True), _non_utf8(root / "test.json", "["))),
    "rsna": ("xbench.data.rsna.RSNAPneumonia", "stage_2_train_labels.csv",
             lambda root: _non_utf8(root / "stage_2_train_labels.csv", "patientId,x,y,width,height,Target")),
    "siim": ("xbench.data.siim.SIIMPneumothorax", "train-rle.csv",
             lambda root: _non_utf8(root / "train-rle.csv", "ImageId, EncodedPixels")),
    "covid_rural": ("xbench.data.covid_rural.COVIDRural", "split.csv",
                    lambda root: ((root / "jpgs").mkdir(parents=True), (root / "pngs_masks").mkdir(),
                                  _non_utf8(root / "split.csv", "filepath"))[2]),
    "chexlocalize": ("xbench.data.chexlocalize.CheXlocalize", "test_labels.csv",
                     lambda root: ((root / "CheXpert" / "test").mkdir(parents=True),
                                   (root / "CheXlocalize").mkdir(),
                                   (root / "CheXlocalize" / "gt_segmentations_test.json").write_text("{}"),
                                   _non_utf8(root / "CheXpert" / "test_labels.csv", "Path,Edema"))[3]),
    "chestxray14": ("xbench.data.chestxray14.ChestXray14Boxes", "BBox_List_2017.csv",
                    lambda root: _non_utf8(root / "BBox_List_2017.csv", "Image Index,Finding Label,Bbox [x,y,w,h]")),
    "vindr boxes": ("xbench.data.vindr.VinDrCXR", "annotations_test.csv",
                    lambda root: ((root / "test").mkdir(parents=True), _vindr_labels(root, ["a"]),
                                  _non_utf8(root / "annotations" / "annotations_test.csv",
                                            "image_id,class_name,x_min,y_min,x_max,y_max"))[2]),
    "vindr labels": ("xbench.data.vindr.VinDrCXR", "image_labels_test.csv",
                     lambda root: ((root / "test").mkdir(parents=True),
                                   _non_utf8(root / "annotations" / "image_labels_test.csv", "image_id,Aortic enlargement"),
                                   (root / "annotations" / "annotations_test.csv").write_text(
                                       "image_id,rad_id,class_name,x_min,y_min,x_max,y_max\n"))[1]),
    "ms_cxr": ("xbench.data.ms_cxr.MSCXR", "MS_CXR_Local_Alignment_v1.1.0.csv",
               lambda root: _non_utf8(root / "MS_CXR_Local_Alignment_v1.1.0.csv", "dicom_id,category_name")),
}


@pytest.mark.parametrize("loader", NON_UTF8)
def test_every_loader_names_an_annotation_file_that_is_not_utf8(tmp_path, loader):
    import importlib

    class_path, file_name, make = NON_UTF8[loader]
    root = tmp_path / "root"
    make(root)
    module, _, name = class_path.rpartition(".")
    extra = {"split_file": "split.csv"} if loader == "covid_rural" else {}
    datamodule = getattr(importlib.import_module(module), name)(root=str(root), **extra)
    with pytest.raises(ValueError, match="is not UTF-8 text") as error:
        _ = datamodule.samples
    assert file_name in str(error.value) and "Save it as UTF-8" in str(error.value), str(error.value)


@pytest.mark.parametrize(("box", "message"), [
    ("[4, 4, 1e400, 20]", "box [4, 4, inf, 20] for 'Mass' is not [x1, y1, x2, y2] of finite numbers"),
    ("[4, NaN, 20, 20]", "box [4, nan, 20, 20] for 'Mass' is not [x1, y1, x2, y2] of finite numbers"),
    ("[4, true, 20, 20]", "box [4, True, 20, 20] for 'Mass' is not [x1, y1, x2, y2]"),
])
def test_a_chestx_det10_box_that_is_not_finite_is_named(tmp_path, capsys, box, message):
    """Issue 30.4: an infinite corner failed in a worker with 'cannot convert float infinity to integer'."""
    root = det10_root(tmp_path, [ENTRY])
    (root / "test.json").write_text(f'[{{"file_name": "a.png", "syms": ["Mass"], "boxes": [{box}]}}]')
    code, err = run_cli(quiet_run("centre_prior", "chestx_det10", root, tmp_path / "results"), capsys)
    assert_one_line(code, err, 1, f"{root / 'test.json'}, entry 0: {message}")
    assert left_behind(tmp_path / "results") == []


@pytest.fixture(scope="module")
def png_folder_example():
    import importlib.util
    from pathlib import Path

    path = Path(__file__).resolve().parents[1] / "examples" / "png_folder.py"
    spec = importlib.util.spec_from_file_location("png_folder", path)
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


@pytest.mark.parametrize(("row", "message"), [
    ("a.png,Nodule,1,1,inf,5", "line 2: the box needs finite corners with x2 > x1 and y2 > y1"),
    ("a.png,Nodule,1,1,1e400,5", "line 2: the box needs finite corners"),
    ("a.png,Nodule,1,nan,4,5", "line 2: the box needs finite corners"),
    ("a.png,Nodule,5,1,1,5", "line 2: the box needs finite corners with x2 > x1"),
])
def test_the_png_folder_example_refuses_a_box_that_is_not_finite(png_folder_example, tmp_path, row, message):
    _png(tmp_path / "images" / "a.png", (16, 16))
    (tmp_path / "boxes.csv").write_text("image,finding,x1,y1,x2,y2\n" + row + "\n")
    with pytest.raises(ValueError, match=message) as error:
        _ = png_folder_example.PngFolder(root=str(tmp_path)).samples
    assert str(tmp_path / "boxes.csv") in str(error.value)


def _vindr(root, box_rows):
    from conftest import write_dicom
    import numpy as np

    (root / "test").mkdir(parents=True, exist_ok=True)
    write_dicom(root / "test" / "a.dicom", np.zeros((40, 48), np.uint8))
    _vindr_labels(root, ["a"])
    (root / "annotations" / "annotations_test.csv").write_text(
        "image_id,rad_id,class_name,x_min,y_min,x_max,y_max\n" + "".join(f"a,R1,{row}\n" for row in box_rows))


def test_vindr_refuses_an_inverted_box_as_every_loader_does(tmp_path):
    """Issue 30.4: VinDr dropped it silently (counted as degenerate) where every other loader refuses it."""
    from xbench.data.vindr import VinDrCXR

    _vindr(tmp_path, ["Cardiomegaly,10,10,20,20", "Aortic enlargement,30,10,20,20"])
    with pytest.raises(ValueError) as error:
        _ = VinDrCXR(root=str(tmp_path)).samples
    assert f"{tmp_path / 'annotations' / 'annotations_test.csv'}, line 3: box" in str(error.value)
    assert "is inverted (x_max < x_min or y_max < y_min); correct the row" in str(error.value)


def test_vindr_still_skips_and_counts_a_box_of_zero_width(tmp_path):
    from xbench.data.vindr import VinDrCXR

    _vindr(tmp_path, ["Cardiomegaly,10,10,20,20", "Aortic enlargement,20,10,20,20"])
    datamodule = VinDrCXR(root=str(tmp_path))
    with pytest.warns(UserWarning, match="skipped 1 boxes of zero width or height"):
        _ = datamodule.samples
    assert datamodule.notes["degenerate_boxes_skipped"] == 1


def _ms_cxr(tmp_path, width, height):
    from conftest import write_ms_cxr

    rows = [{"dicom_id": "d1", "category_name": "Pneumonia", "label_text": "left lower lobe opacity",
             "path": "files/p10/p10000001/s1/d1.jpg", "x": 4, "y": 4, "w": 10, "h": 10,
             "image_width": width, "image_height": height}]
    return write_ms_cxr(tmp_path / "ms_cxr", rows, size=(64, 48)).parent


def test_an_ms_cxr_size_of_another_aspect_stops_the_run_naming_file_and_line(tmp_path, capsys):
    """Issue 30.2: 1024 x 2048 stated for a 64 x 48 JPEG stretched the boxes unevenly. The error is
    raised where the boxes are drawn, in a DataLoader worker: the message is the worker's own line."""
    root = _ms_cxr(tmp_path, 1024, 2048)
    code, err = run_cli(quiet_run("centre_prior", "ms_cxr", root, tmp_path / "results", "--data.num_workers", "1"),
                        capsys)
    assert_one_line(code, err, 1, f"{root / 'MS_CXR_Local_Alignment_v1.1.0.csv'}, line 2 (image_width x image_height "
                                  "of d1", "on a 1024 x 2048 grid (width x height) but the image is 64 x 48")
    assert left_behind(tmp_path / "results") == []


@pytest.mark.parametrize(("width", "height", "refused"), [(1283, 962, False), (128, 96, False), (64, 64, True),
                                                          (48, 64, True)])
def test_ms_cxr_takes_a_proportional_size_and_refuses_another_aspect(tmp_path, width, height, refused):
    from xbench.data.ms_cxr import MSCXR

    datamodule = MSCXR(root=str(_ms_cxr(tmp_path, width, height)), cache=False, num_workers=0, image_size=16)
    datamodule.setup("test")
    if refused:
        with pytest.raises(ValueError, match=r"line 2 .*another aspect ratio"):
            datamodule.test_set[0]
    else:
        assert datamodule.test_set[0]["query_has_mask"].any()


def test_chestxray14_boxes_on_an_image_of_another_aspect_are_named(tmp_path):
    from xbench.data.chestxray14 import ChestXray14Boxes

    _png(tmp_path / "images" / "00000001_000.png", (128, 96))
    (tmp_path / "BBox_List_2017.csv").write_text("Image Index,Finding Label,Bbox [x,y,w,h],,,\n"
                                                 "00000001_000.png,Mass,10,10,100,100\n")
    datamodule = ChestXray14Boxes(root=str(tmp_path), cache=False, num_workers=0, image_size=16)
    with pytest.warns(UserWarning, match="no Data_Entry"):
        datamodule.setup("test")
    with pytest.raises(ValueError, match=r"BBox_List_2017.csv, line 2 \(image 00000001_000.png"):
        datamodule.test_set[0]


# -- options: each checked where it is given, named as the command line spells it --------------

@pytest.mark.parametrize(("model", "extra", "status", "named"), [
    ("centre_prior", ("--data.image_size", "1"), 1, "--data.image_size must be 2 to 4096 pixels"),
    ("centre_prior", ("--data.image_size", "65536"), 1, "--data.image_size must be 2 to 4096 pixels"),
    ("centre_prior", ("--data.classes", "[]"), 1, "--data.classes: the class list is empty"),
    ("centre_prior", ("--trainer.precision", "bogus"), 2, "option 'trainer.precision': Expected"),
    ("centre_prior", ("--seed_everything", "abc"), 2, "option 'seed_everything': Expected"),
    ("centre_prior", ("--model.sigma", "0"), 1, "--model.sigma must be a positive fraction of the image side; got 0"),
    ("centre_prior", ("--model.sigma", "-0.2"), 1, "--model.sigma must be a positive fraction"),
    ("centre_prior", ("--model.sigma", "inf"), 2, "option 'sigma': Expected a <class 'float'>. Got value: inf"),
    ("random", ("--model.grid", "0"), 1, "--model.grid must be at least 1"),
    ("centre_prior", ("--data.num_images", "-1"), 1, "--data.num_images must be at least 1; got -1"),
    ("centre_prior", ("--data.num_images", "0"), 1, "--data.num_images must be at least 1; got 0"),
    ("centre_prior", ("--data.native_size", "0"), 1, "--data.native_size must be at least 38; got 0"),
    ("centre_prior", ("--data.native_size", "10"), 1, "--data.native_size must be at least 38; got 10"),
    ("centre_prior", ("--trainer.limit_test_batches", "-1"), 1, "limit_test_batches"),
    ("centre_prior", ("--trainer.accelerator", "abacus"), 1, "accelerator='abacus'"),
])
def test_a_bad_value_is_named_by_its_option(phantom_root, tmp_path, capsys, model, extra, status, named):
    code, err = run_cli(quiet_run(model, "phantom", phantom_root, tmp_path / "results", *extra), capsys)
    assert_one_line(code, err, status, named)
    assert left_behind(tmp_path / "results") == []


@pytest.mark.parametrize(("content", "named"), [
    (b"", "is empty, not a mapping of settings"),
    (b"- a\n- b\n", "holds a YAML list"),
    (b"hello\n", "holds a YAML str ('hello')"),
    (b"model: [\n", ", line 2, column 1: not valid YAML"),
    (b"data:\n  init_args: {root: x\n", ", line 3, column 1: not valid YAML"),
    (b"model: \xff\n", "is not UTF-8 text"),
])
def test_a_config_file_that_is_not_a_mapping_is_named_with_its_line(phantom_root, tmp_path, capsys, content, named):
    """Issue 30.4: "Unexpected config" or "<unicode string>" did not say which file; an empty
    ``--config`` added to a valid run is named too."""
    config = tmp_path / "extra.yaml"
    config.write_bytes(content)
    code, err = run_cli(quiet_run("centre_prior", "phantom", phantom_root, tmp_path / "results", "--config",
                                  str(config)), capsys)
    assert_one_line(code, err, 2, f"--config {config}", named)
    assert left_behind(tmp_path / "results") == []


# -- the Oracle keeps its promise at the smallest frame; results follow the umask ---------------

@pytest.fixture(scope="module")
def oracle_at_two(tmp_path_factory):
    """The Oracle at the smallest frame, 2 x 2, on a Mass box that fills the image and a Nodule
    box that fills one of the four frame pixels; run under umask 002."""
    import os

    folder = tmp_path_factory.mktemp("oracle2")
    root = write_chestx_det10(folder / "det10", [
        {"file_name": "a.png", "syms": ["Mass"], "boxes": [[0, 0, 48, 48]]},
        {"file_name": "b.png", "syms": ["Nodule"], "boxes": [[0, 0, 30, 30]]}], size=48)
    previous = os.umask(0o002)
    try:
        metrics = main(quiet_run("oracle", "chestx_det10", root, folder / "results", "--data.classes", "[mass,nodule]",
                                 image_size=2))
    finally:
        os.umask(previous)
    return metrics, folder / "results"


def test_the_oracle_scores_perfectly_where_a_region_fills_the_frame(oracle_at_two):
    """Issue 30.4: a frame-filling region made the Oracle's map constant, which the metrics count as
    pointing nowhere (at image_size 1, every region did: Pointing Game 0). Its map there is now a
    ramp inside the region, and a 1-pixel frame is refused."""
    metrics, _ = oracle_at_two
    graded = {key: v for key, v in metrics["grounding"]["per_class"].items() if v["pairs"]}
    assert set(graded) == {"mass", "nodule"}, graded
    assert all(v["pointing_game"] == 1.0 and v["dice@best"] == 1.0 and v["iou@best"] == 1.0
               for v in graded.values()), graded


def test_results_follow_the_users_umask(oracle_at_two):
    """Issue 30.5: tempfile's staging made folders drwx------ and files -rw-------."""
    import stat

    _, results = oracle_at_two
    (folder,) = [p for p in results.iterdir() if not p.name.startswith(".")]
    assert stat.S_IMODE(folder.stat().st_mode) == 0o775
    assert {stat.S_IMODE(p.stat().st_mode) for p in folder.iterdir()} == {0o664}


@pytest.mark.parametrize(("errno", "text"), [(27, "File too large"), (28, "No space left on device")])
def test_a_failed_write_names_the_file_and_leaves_no_folder(phantom_root, tmp_path, monkeypatch, capsys, errno, text):
    """A full disk or a file-size limit while the results are written: no staged or half-written
    folder is left, and the error names the file (issue 30.4: "[Errno 27] File too large" did not)."""
    import xbench.results.write as results_module

    def refused(*args, **kwargs):
        raise OSError(errno, text)

    monkeypatch.setattr(results_module, "pair_table", refused)
    code, err = run_cli(quiet_run("oracle", "phantom", phantom_root, tmp_path / "results"), capsys)
    assert_one_line(code, err, 1, f"[Errno {errno}] {text}: writing pairs.csv.gz into the results folder "
                    f"{tmp_path / 'results' / 'oracle__phantom__'}", "free space or lift",
                    "no part of the folder was kept")
    assert left_behind(tmp_path / "results") == []


def test_a_corrupt_safetensors_checkpoint_is_named(tmp_path, capsys):
    path = tmp_path / "model.safetensors"
    path.write_bytes((200).to_bytes(8, "little") + b"{ not json")
    code, err = inspect(path, capsys)
    assert_one_line(code, err, 1, f"cannot read checkpoint {path}", "fetch it again")


# -- the suite: its file checked, and exit 1 when it cannot do what it lists --------------------

SUITE_CASES = {
    "settings a list": ("models: [m.yaml]\ndatasets: [d.yaml]\nsettings: [data.image_size, 32]\n",
                        ": settings: settings must be a mapping of xbench.test options"),
    "settings a string": ("models: [m.yaml]\ndatasets: [d.yaml]\nsettings: data.image_size=32\n",
                          ": settings: settings must be a mapping"),
    "an entry's settings a list": ("models: [{config: m.yaml, settings: [1]}]\ndatasets: [d.yaml]\n",
                                   ": models[0]: settings must be a mapping"),
    "a list": ("- m.yaml\n", ": a suite file is a mapping with the keys"),
    "empty": ("", ": a suite file is a mapping with the keys ['datasets', 'mode', 'models', 'results_dir', "
                  "'settings', 'slurm']; got an empty file"),
    "invalid YAML": ("models: [m.yaml\n", ", line 2, column 1: not valid YAML"),
    "models a string": ("models: m.yaml\ndatasets: [d.yaml]\n", ": `models` must list at least one config"),
    "results_dir a number": ("models: [m.yaml]\ndatasets: [d.yaml]\nresults_dir: 3\n", ": results_dir must be a"),
}


@pytest.mark.parametrize("case", SUITE_CASES)
def test_a_bad_suite_file_is_named(tmp_path, capsys, monkeypatch, case):
    from xbench.suite import main as suite_main

    monkeypatch.chdir(tmp_path)
    (tmp_path / "suite.yaml").write_text(SUITE_CASES[case][0])
    code, err = run_command(suite_main, ["--config", "suite.yaml"], "xbench-suite", capsys)
    assert_one_line(code, err, 1, "suite.yaml" + SUITE_CASES[case][1])
    assert left_behind(tmp_path / "results") == []


@pytest.mark.parametrize(("models", "datasets", "printed"), [
    ("[nowhere/m.yaml]", "[DATA]", "names config files that do not exist: nowhere/m.yaml"),
    ("[MODEL]", "[{config: DATA, settings: {data.root: nowhere/det10}}]", "No pair could run"),
])
def test_a_suite_that_can_run_nothing_exits_1(tmp_path, capsys, monkeypatch, models, datasets, printed):
    """Issue 30.4: a suite whose only model config was missing exited 0, having run nothing."""
    from xbench.suite import main as suite_main

    monkeypatch.chdir(tmp_path)
    text = f"results_dir: results\nmodels: {models}\ndatasets: {datasets}\n"
    text = text.replace("MODEL", str(CONFIGS_DIR / "models" / "centre_prior.yaml"))
    (tmp_path / "suite.yaml").write_text(text.replace("DATA", str(CONFIGS_DIR / "data" / "chestx_det10.yaml")))
    assert suite_main(["--config", "suite.yaml"]) == 1
    assert printed in " ".join(capsys.readouterr().out.split())
    assert left_behind(tmp_path / "results") == []


def test_a_suite_names_a_model_config_that_is_not_yaml(tmp_path, capsys, monkeypatch):
    from xbench.suite import main as suite_main

    monkeypatch.chdir(tmp_path)
    (tmp_path / "m.yaml").write_text("model: [\n")
    (tmp_path / "suite.yaml").write_text(f"models: [m.yaml]\ndatasets: [{CONFIGS_DIR / 'data' / 'phantom.yaml'}]\n")
    code, err = run_command(suite_main, ["--config", "suite.yaml"], "xbench-suite", capsys)
    assert_one_line(code, err, 1, "m.yaml, line 2, column 1: not valid YAML")


# -- the report and the analysis: a damaged results folder is named -----------------------------

@pytest.fixture(scope="module")
def finished_runs(phantom_root, tmp_path_factory):
    """Two finished runs on the 9-image phantom (the report reads models beside the Oracle), to damage copies of."""
    results = tmp_path_factory.mktemp("finished") / "results"
    for model in ("oracle", "centre_prior"):
        main(quiet_run(model, "phantom", phantom_root, results))
    return results


def _edit_json(folder, change):
    payload = json.loads((folder / "metrics.json").read_text())
    (folder / "metrics.json").write_text(json.dumps(change(payload)))


def _edit_pairs(folder, change):
    import gzip

    (folder / "pairs.csv.gz").write_bytes(gzip.compress(change(gzip.decompress((folder / "pairs.csv.gz").read_bytes()))))


def _edit_table(folder, file, change):
    import gzip

    path = folder / file
    path.write_bytes(gzip.compress(change(gzip.decompress(path.read_bytes()).decode()).encode()))


def _lines(change):
    """A change to a table's text as a list of lines (header first)."""
    return lambda text: "\n".join(change(text.rstrip("\n").split("\n"))) + "\n"


#: Quantus' families' tables (every run writes them) and their sections: a damaged one is named with
#: its row where it has one, never read as undefined values or fewer pairs (issue 44).
EXPLANATION_DAMAGE = {
    "a table missing": ("localisation.csv.gz", lambda f: (f / "localisation.csv.gz").unlink(),
                        "is missing, but metrics.json holds a localisation section"),
    "a table truncated": ("complexity.csv.gz",
                          lambda f: (f / "complexity.csv.gz").write_bytes((f / "complexity.csv.gz").read_bytes()[:60]),
                          "cannot be read"),
    "a value as text": ("randomisation.csv.gz", lambda f: _edit_table(f, "randomisation.csv.gz", _lines(
        lambda rows: [rows[0], *(",".join([*r.split(",")[:-1], "high"]) for r in rows[1:2]), *rows[2:]])),
        "data row 2: random_logit is 'high', not a number"),
    "a value infinite": ("complexity.csv.gz", lambda f: _edit_table(f, "complexity.csv.gz", _lines(
        lambda rows: [rows[0], ",".join([*rows[1].split(",")[:-1], "inf"]), *rows[2:]])),
        "complexity holds an infinite value"),
    "a column missing": ("localisation.csv.gz", lambda f: _edit_table(f, "localisation.csv.gz", _lines(
        lambda rows: [",".join(r.split(",")[:-1]) for r in rows])), "columns missing: pixel_auc"),
    "a row dropped": ("localisation.csv.gz", lambda f: _edit_table(f, "localisation.csv.gz", _lines(
        lambda rows: rows[:-1])), "pairs, but metrics.json's localisation section counts"),
    "a row twice": ("complexity.csv.gz", lambda f: _edit_table(f, "complexity.csv.gz", _lines(
        lambda rows: [*rows[:-1], rows[1]])), "an (image, class) pair appears twice"),
    "an unknown class": ("localisation.csv.gz", lambda f: _edit_table(f, "localisation.csv.gz", _lines(
        lambda rows: [rows[0], ",".join([*rows[1].split(",")[:2], "dragon", *rows[1].split(",")[3:]]), *rows[2:]])),
        "data row(s) 2: image_id or class not among the run's images and classes"),
    "a section not a dict": ("metrics.json", lambda f: _edit_json(f, lambda p: {**p, "complexity": [1, 2]}),
                             "'complexity' is not an explanation section"),
    "a section without its means": ("metrics.json", lambda f: _edit_json(
        f, lambda p: {**p, "localisation": {**p["localisation"], "macro": None}}),
        "'localisation' is not an explanation section"),
}


DAMAGE = {
    "metrics.json a list": ("metrics.json", lambda f: (f / "metrics.json").write_text("[1, 2]"),
                            "holds a JSON list, not a run's results"),
    "metrics.json not UTF-8": ("metrics.json", lambda f: (f / "metrics.json").write_bytes(b'{"a": "\xff"}'),
                               "is not UTF-8 text"),
    "metrics.json without classes": ("metrics.json", lambda f: _edit_json(f, lambda p: {**p, "classes": None}),
                                     "'classes' is missing or not a list"),
    "metrics.json data a list": ("metrics.json", lambda f: _edit_json(f, lambda p: {**p, "data": []}),
                                 "'data' is missing or not a dict"),
    "pairs truncated": ("pairs.csv.gz", lambda f: (f / "pairs.csv.gz").write_bytes((f / "pairs.csv.gz").read_bytes()[:200]),
                        "cannot be read (EOFError"),
    "pairs empty": ("pairs.csv.gz", lambda f: (f / "pairs.csv.gz").write_bytes(b""), "cannot be read"),
    "pairs not gzip": ("pairs.csv.gz", lambda f: (f / "pairs.csv.gz").write_bytes(b"a,b\n1,2\n"),
                       "cannot be read (BadGzipFile"),
    "pairs random bytes": ("pairs.csv.gz", lambda f: (f / "pairs.csv.gz").write_bytes(bytes(range(256))),
                           "cannot be read"),
    "pairs logit text": ("pairs.csv.gz", lambda f: _edit_pairs(f, lambda t: t.replace(b",10.0,", b",high,", 1)),
                         "logit is not a finite number"),
    "pairs graded text": ("pairs.csv.gz", lambda f: _edit_pairs(f, lambda t: t.replace(b",True,", b",yes,", 1)),
                          "the graded column must hold True or False only"),
    **EXPLANATION_DAMAGE,
}


@pytest.mark.parametrize("case", DAMAGE)
def test_a_damaged_results_folder_is_named_by_the_analysis(finished_runs, tmp_path, capsys, case):
    """Issue 30.4: "'list' object has no attribute 'get'", "Compressed file ended ..." named nothing."""
    import shutil

    from xbench.analyze import main as analyze_main

    file_name, damage, named = DAMAGE[case]
    copy = tmp_path / "results"
    shutil.copytree(finished_runs, copy)
    (folder,) = copy.glob("oracle__*")
    damage(folder)
    reseal(folder)  # past the manifest: the check behind it is what is tested
    code, err = run_command(analyze_main, [str(copy), "--out", str(tmp_path / "out"), "--replicates", "5"],
                            "xbench-analyze", capsys)
    assert_one_line(code, err, 1, str(folder / file_name), named)
    assert left_behind(tmp_path / "out") == []


@pytest.mark.parametrize(("file_name", "damage", "named"), [
    ("overlays.npz", lambda f: (f / "overlays.npz").write_bytes((f / "overlays.npz").read_bytes()[:100]),
     "overlays.npz cannot be read"),
    ("metrics.json", lambda f: _edit_json(f, lambda p: {**p, "grounding": {**p["grounding"], "per_class": {}}}),
     "grounding.per_class lacks some of the classes"),
    ("metrics.json", lambda f: _edit_json(f, lambda p: {k: v for k, v in p.items() if k != "created"}),
     "'created' is missing or not a str"),
])
def test_a_damaged_results_folder_is_named_by_the_report(finished_runs, tmp_path, capsys, file_name, damage, named):
    import shutil

    from xbench.report import main as report_main

    copy = tmp_path / "results"
    shutil.copytree(finished_runs, copy)
    (folder,) = copy.glob("centre_prior__*")
    damage(folder)
    reseal(folder)  # past the manifest: the check behind it is what is tested
    code, err = run_command(report_main, [str(copy), "--out", str(tmp_path / "out"), "--no-analysis"],
                            "xbench-report", capsys)
    assert_one_line(code, err, 1, str(folder / file_name), named, "re-run that model on that dataset")
    assert left_behind(tmp_path / "out") == []


@pytest.mark.parametrize(("command", "extra", "named"), [
    ("analyze", ["--size-bins", "2"], "--size-bins must be strictly increasing fractions of the image in (0, 1)"),
    ("report", ["--size-bins", "0.5", "0.1"], "--size-bins must be strictly increasing fractions"),
    ("analyze", ["--replicates", "0"], "--replicates must be at least 1; got 0"),
    ("analyze", ["--confidence", "1.5"], "--confidence must lie in (0, 1), e.g. 0.95; got 1.5"),
    ("analyze", ["--folds", "1"], "--folds must be at least 2; got 1"),
    ("analyze", ["--folds", "20"], "got 20 folds for 9 images: give --folds at most the number of images"),
])
def test_an_analysis_option_out_of_range_is_named(finished_runs, tmp_path, capsys, command, extra, named):
    import importlib

    module = importlib.import_module(f"xbench.{command}")
    code, err = run_command(module.main, [str(finished_runs), "--out", str(tmp_path / "out"), "--replicates", "5",
                                          *extra], f"xbench-{command}", capsys)
    assert_one_line(code, err, 1, named)
    assert left_behind(tmp_path / "out") == []


# -- the suite launchers: slurm values, one launcher per results folder, a failed start (issue 41) ------

SLURM_CASES = {
    "a line break in a value runs a command": ({"sbatch": {"account": "mylab\ntouch marker\n#"}},
                                               "slurm.sbatch.account must be an account's name"),
    "a start of --output's name": ({"sbatch": {"outp": "log"}}, "slurm.sbatch: outp is the start of --output"),
    "--job-name spelt with _": ({"sbatch": {"job_name": "x"}}, "slurm.sbatch: job_name is --job-name"),
    "--export": ({"sbatch": {"export": "NONE"}}, "slurm.sbatch: export is --export, an option XBench sets"),
    "a line break in a key": ({"sbatch": {"qos\n#SBATCH --output": "x"}},
                              "slurm.sbatch: 'qos\\n#SBATCH --output' is not an sbatch option"),
    "an #SBATCH line in the time": ({"time": "4:00:00\n#SBATCH --output=x"}, "slurm.time is how long one job"),
    "a shell command in mem": ({"mem": "64G; touch marker"}, "slurm.mem is the memory of a job"),
    "a second option in the partition": ({"partition": "gpu --output=x"}, "slurm.partition must be a partition's"),
    "a mapping as a value": ({"sbatch": {"constraint": {"a100": 1}}}, "slurm.sbatch.constraint must be node feat"),
    "a list as a value": ({"sbatch": {"gres": ["gpu:1"]}}, "slurm.sbatch.gres must be generic resources"),
    "a fraction of a GPU": ({"gpus_per_task": 1.5}, "slurm.gpus_per_task must be a whole number"),
    "a key that is a number": ({1: "x"}, "slurm: unknown keys [1]"),
    "a flag set false": ({"sbatch": {"exclusive": False}}, "slurm.sbatch.exclusive must be one word"),
    "a space in a free value": ({"sbatch": {"comment": "two words"}}, "slurm.sbatch.comment must be one word"),
}


def write_runnable_suite(folder, phantom_root, **more) -> None:
    """``suite.yaml`` in ``folder``: the centre prior on the phantom, results in ``folder/results``."""
    import yaml

    (folder / "suite.yaml").write_text(yaml.safe_dump({
        "results_dir": str(folder / "results"),
        "settings": {"data.image_size": 32, "data.num_workers": 0, "trainer.logger": False},
        "models": [str(CONFIGS_DIR / "models" / "centre_prior.yaml")],
        "datasets": [{"config": str(CONFIGS_DIR / "data" / "phantom.yaml"), "settings": {"data.root": str(phantom_root)}}],
        **more,
    }))


@pytest.mark.parametrize("case", SLURM_CASES)
def test_a_slurm_value_that_is_not_a_setting_is_refused(tmp_path, capsys, monkeypatch, phantom_root, case):
    """Issue 41.1: a line break in sbatch.account reached the job's script as a command."""
    from xbench.suite import main as suite_main

    block, named = SLURM_CASES[case]
    monkeypatch.chdir(tmp_path)
    write_runnable_suite(tmp_path, phantom_root, slurm={"time": 60, **block})
    code, err = run_command(suite_main, ["--config", "suite.yaml", "--launcher", "slurm"], "xbench-suite", capsys)
    assert_one_line(code, err, 1, f"suite.yaml: {named}")
    assert left_behind(tmp_path / "results") == [] and not (tmp_path / "marker").exists()


def test_a_results_dir_with_a_line_break_is_refused(tmp_path, capsys, monkeypatch):
    """It names each SLURM job's log in the job's script."""
    from xbench.suite import main as suite_main

    monkeypatch.chdir(tmp_path)
    (tmp_path / "suite.yaml").write_text('results_dir: "results\\n#SBATCH --output=x"\nmodels: [m.yaml]\n'
                                         "datasets: [d.yaml]\n")
    code, err = run_command(suite_main, ["--config", "suite.yaml"], "xbench-suite", capsys)
    assert_one_line(code, err, 1, "suite.yaml: results_dir must be a folder's path, without line breaks")
    assert sorted(path.name for path in tmp_path.iterdir()) == ["suite.yaml"]


def test_a_second_suite_on_a_results_folder_in_use_names_the_first(tmp_path, capsys, monkeypatch, phantom_root):
    """Issue 41.2: two launchers ran the same pairs at once. The lock is flock's: the test holds it as
    another suite would (a second open file of the same process conflicts like another process's)."""
    import os
    from pathlib import Path

    from xbench.launch import results_lock
    from xbench.suite import main as suite_main

    monkeypatch.chdir(tmp_path)
    write_runnable_suite(tmp_path, phantom_root)
    with results_lock(tmp_path / "results", Path("first.yaml")):
        code, err = run_command(suite_main, ["--config", "suite.yaml"], "xbench-suite", capsys)
        assert_one_line(code, err, 1, f"{tmp_path / 'results'} is in use by another suite (pid {os.getpid()} on ",
                        "suite file first.yaml", str(tmp_path / "results" / ".suite" / "lock"), "Let it finish")
        assert left_behind(tmp_path / "results") == [".suite"] and left_behind(tmp_path / "results" / ".suite") == [
            "lock"]
    assert left_behind(tmp_path / "results") == []  # the lock and the folders made for it, removed at its end
    assert suite_main(["--config", "suite.yaml"]) == 0  # the lock is free again
    assert len(list((tmp_path / "results").glob("*/metrics.json"))) == 1
    assert left_behind(tmp_path / "results" / ".suite") == []


def test_a_slurm_launcher_without_slurm_leaves_nothing_behind(tmp_path, capsys, monkeypatch, phantom_root):
    """Issue 41.2: ``--launcher slurm`` where no ``srun`` runs left an empty results/.suite/<time>/."""
    from xbench.suite import main as suite_main

    monkeypatch.chdir(tmp_path)
    (tmp_path / "bin").mkdir()
    monkeypatch.setenv("PATH", str(tmp_path / "bin"))  # no srun on it
    write_runnable_suite(tmp_path, phantom_root, slurm={"time": 60})
    code, err = run_command(suite_main, ["--config", "suite.yaml", "--launcher", "slurm"], "xbench-suite", capsys)
    assert_one_line(code, err, 1, "--launcher slurm: ", "srun", "use --launcher local")
    assert not (tmp_path / "results").exists()


# -- peers' rules at their edges: float64 saved maps, cheXlocalize's left-out pairs (issue 41) ---

def _save_pairs(folder, maps: dict):
    """The per_pair layout for the wide fixture: ``maps`` (image, finding) -> map [h, w], each with a logit."""
    import numpy as np

    for (image, key), value in maps.items():
        (folder / image).mkdir(parents=True, exist_ok=True)
        np.savez(folder / image / f"{key}.npz", map=value, logit=np.float32(0.5))
    return folder


def _bumps(dtype="float64"):
    """Every pair of the wide fixture: a bump inside its box, on an [8, 12] grid (the images' aspect)."""
    import numpy as np

    rows, columns = np.mgrid[0:8, 0:12]
    bump = lambda row, column: np.exp(-((rows - row) ** 2 + (columns - column) ** 2) / 4).astype(dtype)  # noqa: E731
    return {("a.png", "mass"): bump(3, 3), ("a.png", "nodule"): bump(6, 9),
            ("b.png", "mass"): bump(1, 10), ("b.png", "nodule"): bump(3, 6)}


def _saved_run(root, folder, results, capsys, *extra):
    """A per_pair run on the wide fixture through the command line: its exit status and stderr."""
    return run_cli(quiet_run("precomputed_per_pair", "chestx_det10", root, results, "--model.path", str(folder),
                             "--data.classes", "[mass,nodule]", *extra, image_size=16), capsys)


def _grounding(results) -> dict:
    from conftest import only_folder

    return json.loads((only_folder(results) / "metrics.json").read_text())["grounding"]


@pytest.mark.parametrize(("name", "scaled"), [
    ("values beyond float32's range", lambda bump: bump * 1e300),
    ("a spread below float32's resolution", lambda bump: 1 + bump * 1e-9),
])
def test_a_float64_map_is_normalised_before_it_is_rounded(wide_det10, tmp_path, capsys, name, scaled):
    """Rounded to float32 first, 1e300 became infinity (a generic non-finite error) and 1 + 1e-9 x
    a constant (a Pointing Game miss); normalised in float64 first, each scores as the map it scales."""
    plain = _save_pairs(tmp_path / "plain", _bumps())
    odd = _save_pairs(tmp_path / "odd", {pair: scaled(bump) for pair, bump in _bumps().items()})
    for folder in (plain, odd):
        code, err = _saved_run(wide_det10, folder, tmp_path / "results" / folder.name, capsys)
        assert code == 0, err
    expected, got = _grounding(tmp_path / "results" / "plain"), _grounding(tmp_path / "results" / "odd")
    assert got["per_class"]["mass"]["constant_maps"] == 0 and got["per_class"]["mass"]["hits"] == 1, name
    for key in CLASSES:
        assert got["per_class"][key] == pytest.approx(expected["per_class"][key], abs=1e-6), (name, key)


@pytest.mark.parametrize(("dtype", "low", "high"), [("float64", -1e308, 1e308), ("float32", -3e38, 3e38)])
def test_a_map_whose_spread_overflows_is_named(wide_det10, tmp_path, capsys, dtype, low, high):
    """max - min beyond the map's type would normalise to NaN: refused naming the file and the pair."""
    maps = _bumps(dtype)
    maps[("b.png", "nodule")][0, :2] = (low, high)
    folder = _save_pairs(tmp_path / "saved", maps)
    code, err = _saved_run(wide_det10, folder, tmp_path / "results", capsys)
    assert_one_line(code, err, 1, f"{folder / 'b.png' / 'nodule.npz'} (b.png, nodule)",
                    f"span more than torch.{dtype} holds", "save the map scaled down")
    assert left_behind(tmp_path / "results") == []


def test_cheXlocalizes_left_out_pairs_are_counted_not_scored_zero(wide_det10, tmp_path, capsys):
    """A map whose Otsu segmentation is empty (one bright cell at native size: a single-point
    contour, which their code drops) scored IoU 0 inside the mean; their eval.py's default
    true_pos_only leaves it out. metrics.json counts it and the summary says so."""
    import numpy as np

    from conftest import only_folder

    maps = _bumps("float32")
    spike = np.zeros((32, 48), np.float32)  # at native size: no upsampling spreads the cell
    spike[10, 10] = 1.0
    maps[("a.png", "mass")] = spike
    folder = _save_pairs(tmp_path / "saved", maps)
    code, err = _saved_run(wide_det10, folder, tmp_path / "results", capsys, "--model.native_protocol", "true")
    assert code == 0, err
    run = only_folder(tmp_path / "results")
    native = json.loads((run / "metrics.json").read_text())["precomputed"]["chexlocalize_protocol"]["per_class"]
    assert native["mass"]["pairs"] == 1 and native["mass"]["chexlocalize_iou_otsu_left_out"] == 1
    assert native["mass"]["chexlocalize_iou_otsu"] is None and native["mass"]["xbench_pointing_game"] == 1.0
    assert native["mass"]["chexlocalize_iou_fixed"] == pytest.approx(1 / 256)  # one pixel of the 16 x 16 box
    assert native["nodule"]["chexlocalize_iou_otsu_left_out"] == 0 and native["nodule"]["chexlocalize_iou_otsu"] > 0
    assert "0 pairs with an empty fixed-threshold segmentation and 1 with an empty Otsu segmentation are left " \
           "out of their IoU means" in (run / "summary.md").read_text()
# -- small surfaces: the unpickler, the checks' options, the example's weights, a full disk (issue 41) ---------

CLAIM = (2**62).to_bytes(8, "little")
ASKS = "where the pickle asks for 4,611,686,018,427,387,904 bytes"


def _call(module: str, name: str, *arguments: bytes) -> bytes:
    """A protocol-0-style pickle that calls ``module.name`` on the pickled ``arguments``."""
    return (_pickle.GLOBAL + f"{module}\n{name}\n".encode() + _pickle.MARK + b"".join(arguments) + _pickle.TUPLE
            + _pickle.REDUCE + _pickle.STOP)


def _long(value: int) -> bytes:
    return _pickle.LONG1 + bytes([8]) + value.to_bytes(8, "little")


#: Pickles whose stated lengths or builders lie, each with what the refusal says after the file's name.
LYING_PICKLES = {
    "30 bytes claiming 2**62 bytes": (_pickle.PROTO + b"\x04" + _pickle.BINBYTES8 + CLAIM + b"x" * 18 + _pickle.STOP,
                                      f"ends at byte 30, {ASKS} at byte 11"),
    "a bytearray of 2**62 bytes": (_pickle.PROTO + b"\x05" + _pickle.BYTEARRAY8 + CLAIM + _pickle.STOP,
                                   "where the pickle asks for a bytearray of 4,611,686,018,427,387,904 bytes"),
    "a frame of 2**62 bytes": (_pickle.PROTO + b"\x04" + _pickle.FRAME + CLAIM + _pickle.NONE + _pickle.STOP,
                               f"{ASKS} at byte 11"),
    "a string of 2**62 bytes": (_pickle.PROTO + b"\x04" + _pickle.BINUNICODE8 + CLAIM + _pickle.STOP,
                                f"{ASKS} at byte 11"),
    "empty": (b"", "is empty, where the pickle asks for 1 byte at byte 0: it is truncated or damaged"),
    "_codecs.encode to rot13": (_call("_codecs", "encode", _text("abc"), _text("rot13")),
                                "_codecs.encode is admitted only as pickle stores bytes, (str, 'latin1'); got "
                                "(str, 'rot13')"),
    "_codecs.encode of bytes": (_call("_codecs", "encode", _pickle.SHORT_BINBYTES + b"\x02ab", _text("latin1")),
                                "got (bytes, 'latin1')"),
    "_codecs.encode with errors": (_call("_codecs", "encode", _text("abc"), _text("latin1"), _text("ignore")),
                                   "the pickle builds latin1_bytes from other things"),
    "bytes() of a size": (_call("__builtin__", "bytes", _long(2**30)),
                          "the pickle builds empty_bytes from other things"),
    "set() of a string": (_call("builtins", "set", _text("abc")), "a set is built from a list, got str"),
    "an array of 2**40 elements": (_call("numpy.core.multiarray", "_reconstruct",
                                         _pickle.GLOBAL + b"numpy\nndarray\n",
                                         _pickle.MARK + _long(2**40) + _pickle.TUPLE,
                                         _pickle.SHORT_BINBYTES + b"\x01b"),
                                   "an array starts empty, as (0,) of b'b'; got (1099511627776,)"),
}


@pytest.mark.parametrize("case", LYING_PICKLES)
def test_a_pickle_that_lies_is_refused_naming_it(tmp_path, case):
    """Issue 41: 2**62 claimed bytes escaped as a bare MemoryError; each refusal now names the file,
    before anything is allocated for the claim."""
    payload, message = LYING_PICKLES[case]
    path = tmp_path / "a.png_Edema_map.pkl"
    path.write_bytes(payload)
    with pytest.raises(_pickle.UnpicklingError) as error:
        load_data_pickle(path)
    assert str(error.value).startswith(str(path)) and message in str(error.value), str(error.value)


@pytest.mark.parametrize("protocol", range(_pickle.HIGHEST_PROTOCOL + 1))
def test_a_truncated_pickle_of_any_protocol_is_named(tmp_path, protocol):
    import torch

    whole = _pickle.dumps({"map": torch.rand(1, 1, 4, 6), "prob": 0.3, "task": "Edema", "cxr_dims": (6, 4)},
                          protocol=protocol)
    path = tmp_path / "a.png_Edema_map.pkl"
    for end in (1, len(whole) // 3, len(whole) // 2, len(whole) - 1):
        path.write_bytes(whole[:end])
        with pytest.raises(_pickle.UnpicklingError) as error:
            load_data_pickle(path)
        assert str(error.value).startswith(str(path)) and "save it again" in str(error.value), (end, str(error.value))


def test_a_tensor_view_claiming_more_numbers_than_its_storage_is_refused(tmp_path):
    """A stride-0 view of one number claiming 2**40 elements: torch builds it without memory, and
    the first resize of the map would allocate them."""
    import torch

    class Claim:
        def __reduce__(self):
            storage = torch.zeros(1)._typed_storage()
            return torch._utils._rebuild_tensor_v2, (storage, 0, (1, 1, 2**20, 2**20), (0, 0, 0, 0), False, {})

    path = tmp_path / "a.png_Edema_map.pkl"
    path.write_bytes(_pickle.dumps({"map": Claim(), "prob": 0.5}))
    with pytest.raises(_pickle.UnpicklingError, match=r"a tensor of 1,099,511,627,776 elements over a storage of 1 "
                                                      r"claims more numbers than the file holds") as error:
        load_data_pickle(path)
    assert str(error.value).startswith(str(path))


@pytest.mark.parametrize("module", ["_codecs", "builtins", "__builtin__"])
def test_no_protocol_0_to_2_name_changes_anything_outside(tmp_path, module):
    """The names protocols 0 to 2 need, attacked as every allowed name is above."""
    before = _world()
    for allowed in [key for key in ALLOWED_GLOBALS if key[0] == module]:
        list(_load_attacks(tmp_path / "attack_Edema_map.pkl", allowed))
    assert _changed(before, _world()) == []


def test_a_run_on_a_lying_pickle_stops_naming_it(wide_det10, tmp_path, capsys):
    """The CLI's whole path: exit 1, one line naming the file, no results folder."""
    import torch

    saved = tmp_path / "saved"
    saved.mkdir()
    for image in ("a", "b"):
        for pathology in ("Atelectasis", "Consolidation"):
            info = {"map": torch.rand(1, 1, 4, 6), "prob": 0.3, "task": pathology, "cxr_dims": SAVED_SIZE[::-1]}
            (saved / f"{image}.png_{pathology}_map.pkl").write_bytes(_pickle.dumps(info, protocol=2))
    bomb = saved / "b.png_Consolidation_map.pkl"
    bomb.write_bytes(LYING_PICKLES["30 bytes claiming 2**62 bytes"][0])
    layout = CONFIGS_DIR / "models" / "precomputed_chexlocalize.yaml"
    args = quiet_run("centre_prior", "chestx_det10", wide_det10, tmp_path / "results", "--data.classes",
                     "[atelectasis,consolidation]", "--config", str(layout), "--model.path", str(saved))
    code, err = run_cli(args, capsys)
    assert_one_line(code, err, 1, f"{bomb} ends at byte 30, {ASKS}")
    assert left_behind(tmp_path / "results") == []


@pytest.mark.parametrize(("extra", "status", "named"), [
    (("--faithfulness.images", "1", "--faithfulness.steps", "1025"), 1, "--faithfulness.steps must be 1 to 1024, the "
     "pixels of the model's input (each step removes at least one); got 1025"),
    (("--faithfulness.steps", "0"), 1, "--faithfulness.steps must be a whole number of at least 1; got 0"),
    (("--faithfulness.road_percentiles", "[50, 50]"), 1,
     "--faithfulness.road_percentiles must be distinct whole percentiles from 1 to 99, at least one; got [50, 50]"),
    (("--faithfulness.road_percentiles", "[0, 50]"), 1, "--faithfulness.road_percentiles must be distinct whole"),
    (("--faithfulness.road_percentiles", "[50, 100]"), 1, "from 1 to 99, at least one; got [50, 100]"),
    (("--faithfulness.road_percentiles", "[]"), 1, "at least one; got []"),
    (("--faithfulness.images", "-1"), 1, "--faithfulness.images must be 0 (off) or a number of images; got -1"),
    (("--faithfulness.seed", "-1"), 1,
     "--faithfulness.seed must be a whole number from 0 to 4294967295 (the range of --seed_everything); got -1"),
    (("--faithfulness.seed", "4294967296"), 1, "--faithfulness.seed must be a whole number from 0 to 4294967295"),
    (("--sanity.images", "-3"), 1, "--sanity.images must be 0 (off) or a number of images; got -3"),
    (("--sanity.seed", "18446744073709551616"), 1, "--sanity.seed must be a whole number from 0 to 4294967295"),
    (("--faithfulness.steps", "abc"), 2, "option 'faithfulness.steps'"),
    (("--faithfulness.road_percentiles", "[50.5]"), 2, "option 'faithfulness.road_percentiles'"),
    (("--sanity.seed", "1; rm -rf /"), 2, "option 'sanity.seed'"),
])
def test_a_check_option_beyond_what_it_can_mean_is_named(phantom_root, tmp_path, capsys, extra, status, named):
    """Issue 41: 5000 steps on 1,024 pixels and the percentiles [50, 50] were taken without a word."""
    code, err = run_cli(quiet_run("centre_prior", "phantom", phantom_root, tmp_path / "results", *extra), capsys)
    assert_one_line(code, err, status, named)
    assert left_behind(tmp_path / "results") == []


def test_the_largest_seed_runs_road(phantom_root):
    """Each pair's ROAD seed grows from the option's (times 1,000,003 twice): at 2**32 - 1 it passes
    torch's 64-bit range, which the imputation's seeding now wraps into."""
    import torch

    from xbench.metrics.faithfulness import road_inputs
    from xbench.seeds import MAX_SEED, sample_seed

    image, saliency = torch.rand(3, 8, 8), torch.rand(8, 8)
    seed = sample_seed(sample_seed(MAX_SEED, 10**6), 13)
    assert seed >= 2**64
    morf, lerf = road_inputs(image, saliency, [50], seed)
    again = road_inputs(image, saliency, [50], seed % 2**64)
    assert morf.equal(again[0]) and lerf.equal(again[1])


def test_weights_of_another_architecture_name_the_file_and_the_option(phantom_root, tmp_path, capsys, monkeypatch,
                                                                      request):
    """Issue 41: the example's weights for another open_clip architecture listed torch's 40 keys
    but not the file; the loader now names the file, the keys by group and ``--model.arch``."""
    import sys

    examples = CONFIGS_DIR.parent / "examples"
    monkeypatch.syspath_prepend(str(examples))
    request.addfinalizer(lambda: sys.modules.pop("open_clip_model", None))  # tests/test_examples.py imports it fresh
    from open_clip_model import write_random_weights

    weights = tmp_path / "tiny.safetensors"
    write_random_weights(weights)
    arch = json.loads((examples / "tiny_vit.json").read_text())
    arch["vision_cfg"]["layers"] = 3
    (tmp_path / "deeper.json").write_text(json.dumps(arch))
    code, err = run_cli(quiet_run("centre_prior", "phantom", phantom_root, tmp_path / "results", "--config",
                                  str(examples / "open_clip_model.yaml"), "--model.weights", str(weights),
                                  "--model.arch", str(tmp_path / "deeper.json")), capsys)
    assert_one_line(code, err, 1, f"checkpoint {weights} does not match CLIP",
                    "missing in the file (12): visual.transformer.{resblocks.2.",
                    f"Are these weights of --model.arch {tmp_path / 'deeper.json'}?")
    assert left_behind(tmp_path / "results") == []
# -- the report's sanity table and figure: each cascade value checked, named by step (issue 41) --

def _edit_steps(change):
    """A damage of ``metrics.json``'s ``sanity.steps``, in place."""
    def damage(folder):
        payload = json.loads((folder / "metrics.json").read_text())
        change(payload["sanity"]["steps"])
        (folder / "metrics.json").write_text(json.dumps(payload))
    return damage


def _edit_strip(change):
    """A damage of ``sanity_maps.npz``'s arrays (a dict of name -> array), saved back."""
    def damage(folder):
        import numpy as np

        with np.load(folder / "sanity_maps.npz") as saved:
            arrays = dict(saved)
        change(arrays)
        np.savez_compressed(folder / "sanity_maps.npz", **arrays)
    return damage


SANITY_DAMAGE = {
    "a similarity as text": ("metrics.json", _edit_steps(lambda s: s[3].update(spearman_abs="high")),
                             "sanity.steps[3].spearman_abs is 'high', not a finite number or null"),
    "a similarity missing": ("metrics.json", _edit_steps(lambda s: s[2].pop("spearman_abs")),
                             "sanity.steps[2].spearman_abs is missing"),
    "a similarity infinite": ("metrics.json", _edit_steps(lambda s: s[4].update(ssim=float("inf"))),
                              "sanity.steps[4].ssim is inf, not a finite number or null"),
    "a grounding value true": ("metrics.json", _edit_steps(lambda s: s[1]["grounding"].update(pointing_game=True)),
                               "sanity.steps[1].grounding.pointing_game is True, not a finite number"),
    "a step without layers": ("metrics.json", _edit_steps(lambda s: s[0].pop("layers")),
                              "sanity.steps[0] lacks its layers or grounding"),
    "no steps": ("metrics.json", _edit_steps(lambda s: s.clear()), "sanity.steps is missing or not a list of steps"),
    "one map short": ("sanity_maps.npz", _edit_strip(lambda a: a.update(maps=a["maps"][:-1])),
                      "maps (14, 16, 16), image (16, 16) and mask (16, 16) are not one [H, W] map for each of the 15"),
    "a region of another size": ("sanity_maps.npz", _edit_strip(lambda a: a.update(mask=a["mask"][:8])),
                                 "mask (8, 16) are not one [H, W] map"),
    "no maps": ("sanity_maps.npz", _edit_strip(lambda a: a.pop("maps")), "sanity_maps.npz lacks the arrays ['maps']"),
    "the strip truncated": ("sanity_maps.npz",
                            lambda f: (f / "sanity_maps.npz").write_bytes((f / "sanity_maps.npz").read_bytes()[:100]),
                            "sanity_maps.npz cannot be read"),
}


@pytest.mark.parametrize("case", SANITY_DAMAGE)
def test_a_damaged_sanity_cascade_is_named_by_the_report(tmp_path, capsys, case):
    """The cascade's table and figure read every step's similarities and grounding and the saved
    strip: a value that is not a number (a string, a bool, inf), a missing one, or arrays that do not
    fit the steps is one error naming the file and the step, not a traceback or a wrong curve."""
    from test_report import write_sanity_run
    from xbench.report import main as report_main

    file_name, damage, named = SANITY_DAMAGE[case]
    folder = write_sanity_run(tmp_path / "results")
    damage(folder)
    reseal(folder)  # past the manifest: the check behind it is what is tested
    code, err = run_command(report_main, [str(tmp_path / "results"), "--out", str(tmp_path / "out"),
                                          "--no-analysis"], "xbench-report", capsys)
    assert_one_line(code, err, 1, str(folder / file_name), named, "re-run that model on that dataset")
    assert left_behind(tmp_path / "out") == []


def _under_file_size_limit(function, limit: int):
    """``function`` run with the process's file-size limit (``ulimit -f``) at ``limit`` bytes: the
    kernel refuses a longer file with EFBIG (Python ignores the SIGXFSZ that comes with it)."""
    import functools
    import resource

    @functools.wraps(function)
    def limited(*args, **kwargs):
        soft, hard = resource.getrlimit(resource.RLIMIT_FSIZE)
        resource.setrlimit(resource.RLIMIT_FSIZE, (limit, hard))
        try:
            return function(*args, **kwargs)
        finally:
            resource.setrlimit(resource.RLIMIT_FSIZE, (soft, hard))

    return limited


def test_a_results_folder_over_the_file_size_limit_is_named_with_the_fix(phantom_root, tmp_path, monkeypatch, capsys):
    """Issue 41: a real file-size limit while the results are written (metrics.json, ~20 kB, is the
    first file over 4 kB): the results folder and the file are named, with the fix, and nothing is kept."""
    import xbench.reporting.writer as writer

    monkeypatch.setattr(writer, "write_results", _under_file_size_limit(writer.write_results, 4096))
    code, err = run_cli(quiet_run("oracle", "phantom", phantom_root, tmp_path / "results"), capsys)
    assert_one_line(code, err, 1, "[Errno 27] File too large: writing metrics.json into the results folder "
                    f"{tmp_path / 'results' / 'oracle__phantom__'}", "file-size limit such as `ulimit -f`",
                    "free space or lift the limit and run again (no part of the folder was kept)")
    assert left_behind(tmp_path / "results") == []


def test_a_decoded_image_cache_over_the_file_size_limit_is_named_with_the_fix(phantom_root, tmp_path, monkeypatch,
                                                                             capsys):
    """Issue 41: the cache's first file over the limit said only "[Errno 27] File too large"."""
    import xbench.data.base as base

    monkeypatch.setenv("XBENCH_CACHE", str(tmp_path / "cache"))
    monkeypatch.setattr(base, "build_cache", _under_file_size_limit(base.build_cache, 4096))
    code, err = run_cli(quiet_run("oracle", "phantom", phantom_root, tmp_path / "results"), capsys)
    assert_one_line(code, err, 1, "[Errno 27] File too large: writing the decoded-image cache "
                    f"{tmp_path / 'cache' / 'decoded' / 'phantom-'}", "set XBENCH_CACHE to a folder with room, or run "
                    "with --data.cache false")
    assert left_behind(tmp_path / "cache" / "decoded") == [] and left_behind(tmp_path / "results") == []
# -- the decoded-image cache: an entry is read only for the split it was written for (issue 41) ---

import shutil  # noqa: E402

import numpy as np  # noqa: E402

from conftest import only_folder  # noqa: E402
from xbench.cli import error_line  # noqa: E402
from xbench.data.cache import CacheDamagedError  # noqa: E402
from xbench.data.chestx_det10 import ChestXDet10  # noqa: E402

CACHED = [
    {"file_name": "a.png", "syms": ["Mass"], "boxes": [[4, 4, 20, 20]]},
    {"file_name": "b.png", "syms": ["Nodule"], "boxes": [[24, 24, 40, 40]]},
    {"file_name": "c.png", "syms": ["Mass", "Nodule"], "boxes": [[4, 24, 20, 40], [24, 4, 40, 20]]},
]


def _cached_split(root, entries=CACHED, **options) -> ChestXDet10:
    """ChestX-Det10 at ``root`` (written if missing) as ``quiet_run`` sets it up, its cache entry written."""
    if not root.exists():
        write_chestx_det10(root, entries, size=48)
    datamodule = ChestXDet10(root=str(root), image_size=32, num_workers=0, **options)
    datamodule.prepare_data()
    return datamodule


def _copy_entry(source, folder) -> None:
    """Every file of the entry ``source`` over those of ``folder``: a folder copied under the wrong name."""
    for path in source.iterdir():
        shutil.copy(path, folder / path.name)


def _manifest_edit(change, named):
    """A case that rewrites the manifest's JSON with ``change`` and expects the error to say ``named``."""
    def spoil(folder, tmp_path) -> str:
        manifest = json.loads((folder / "manifest.json").read_text())
        (folder / "manifest.json").write_text(json.dumps(change(manifest)))
        return named
    return spoil


def _manifest_bytes(content, named):
    """A case that writes ``content(path)`` as the manifest and expects the error to say ``named``."""
    def spoil(folder, tmp_path) -> str:
        (folder / "manifest.json").write_bytes(content(folder / "manifest.json"))
        return named
    return spoil


def _another_entrys_files(folder, tmp_path) -> str:
    """Issue 41 as found: another annotation file of the same images, its entry copied under this name."""
    other = [{**CACHED[0], "syms": ["Nodule"]}, {**CACHED[2], "file_name": "b.png"},
             {"file_name": "c.png", "syms": [], "boxes": []}]
    _copy_entry(_cached_split(tmp_path / "other", other).cache_folder(), folder)
    return "its manifest.json was written for another entry (fingerprint: "


def _older_format(folder, tmp_path) -> str:
    """An entry as format 4 wrote it: no binding in the manifest or the index."""
    with np.load(folder / "index.npz") as index:
        np.savez(folder / "index.npz", **{name: index[name] for name in index.files if name != "binding"})
    manifest = json.loads((folder / "manifest.json").read_text())
    (folder / "manifest.json").write_text(json.dumps({"format": 4, "samples": 3, "files": manifest["files"]}))
    return "its manifest.json was written in cache format 4 (an older or newer XBench); this one reads format 5"


def _reordered(folder, tmp_path) -> str:
    _copy_entry(_cached_split(tmp_path / "reordered", CACHED[::-1]).cache_folder(), folder)
    return "image ids: the 3 expected in another order (sample 0: 'a.png' expected, 'c.png' found)"


def _subset(folder, tmp_path) -> str:
    _copy_entry(_cached_split(tmp_path / "subset", CACHED[:2]).cache_folder(), folder)
    return "image ids: 2 found, 3 expected; 1 expected ones absent ['c.png'], 0 found ones not expected []"


def _swapped(folder, tmp_path) -> str:
    """This entry and another of the same images (other classes) renamed each into the other's place."""
    other = _cached_split(tmp_path / "det10", classes=["mass", "nodule"]).cache_folder()
    folder.rename(tmp_path / "parked")
    other.rename(folder)
    (tmp_path / "parked").rename(other)
    ours, theirs = folder.name.split("-")[1], other.name.split("-")[1]
    return f"fingerprint: '{ours}' expected, '{theirs}' found)"


def _copy_stopped_before_the_manifest(folder, tmp_path) -> str:
    (folder / "manifest.json").unlink()
    return "its manifest.json cannot be read (No such file or directory)"


def _copy_stopped_inside_natives(folder, tmp_path) -> str:
    natives = folder / "natives.bin"
    natives.write_bytes(natives.read_bytes()[:-64])
    return f"natives.bin holds {natives.stat().st_size} bytes, {natives.stat().st_size + 64} were written"


def _a_file_in_the_entrys_place(folder, tmp_path) -> str:
    shutil.rmtree(folder)
    folder.write_text("")
    return "its manifest.json cannot be read (Not a directory)"


def _with_file(files, name, **change):
    """The manifest's ``files`` with ``change`` made to the entry of ``name``."""
    return {**files, name: {**files[name], **change}}


NOT_A_MANIFEST = "its manifest.json is not a cache manifest"
CACHE_CASES = {
    "another entry's files": _another_entrys_files,
    "older format": _older_format,
    "manifest truncated": _manifest_bytes(lambda path: path.read_bytes()[: path.stat().st_size // 2],
                                          f"{NOT_A_MANIFEST} (Invalid JSON: EOF while parsing"),
    "manifest empty": _manifest_bytes(lambda path: b"", f"{NOT_A_MANIFEST} (Invalid JSON: EOF while parsing a value"),
    "manifest not JSON": _manifest_bytes(lambda path: b"\x89PNG\r\n\x1a\n",
                                         f"{NOT_A_MANIFEST} (Invalid JSON: expected value"),
    "manifest a list": _manifest_bytes(lambda path: b"[5]", f"{NOT_A_MANIFEST} (Input should be an object)"),
    "bytes as text": _manifest_edit(
        lambda m: {**m, "files": _with_file(m["files"], "frames.npy", bytes=str(m["files"]["frames.npy"]["bytes"]))},
        f"{NOT_A_MANIFEST} (files.frames.npy.bytes: Input should be a valid integer)"),
    "image ids numbers": _manifest_edit(lambda m: {**m, "binding": {**m["binding"], "image_ids": [1, 2, 3]}},
                                        f"{NOT_A_MANIFEST} (binding.image_ids.0: Input should be a valid string)"),
    "binding missing": _manifest_edit(lambda m: {key: value for key, value in m.items() if key != "binding"},
                                      f"{NOT_A_MANIFEST} (binding: Field required)"),
    "field injected": _manifest_edit(lambda m: {**m, "binding": {**m["binding"], "root": "/elsewhere"}},
                                     f"{NOT_A_MANIFEST} (binding.root: Extra inputs are not permitted)"),
    "file outside the folder": _manifest_edit(
        lambda m: {**m, "files": {key.replace("natives.bin", "../natives.bin"): v for key, v in m["files"].items()}},
        "its manifest.json lists the files ['../natives.bin', 'frames.npy', 'index.npz', 'masks.npy'], not"),
    "samples reordered": _reordered,
    "samples a subset": _subset,
    "two entries swapped by name": _swapped,
    "copy stopped before the manifest": _copy_stopped_before_the_manifest,
    "copy stopped inside natives.bin": _copy_stopped_inside_natives,
    "a file in the entry's place": _a_file_in_the_entrys_place,
}


@pytest.fixture(scope="module")
def uncached_results(tmp_path_factory):
    """The split's numbers without the cache, to hold a rebuilt cache's run against."""
    root = write_chestx_det10(tmp_path_factory.mktemp("uncached") / "det10", CACHED, size=48)
    results = tmp_path_factory.mktemp("uncached_results")
    main(quiet_run("centre_prior", "chestx_det10", root, results, "--data.cache", "false"))
    return json.loads((only_folder(results) / "metrics.json").read_text())


@pytest.mark.parametrize("case", CACHE_CASES)
def test_a_cache_entry_not_written_for_this_split_is_rebuilt_never_read(tmp_path, capsys, monkeypatch,
                                                                        uncached_results, case):
    """Issue 41: an entry whose files were all another entry's was read, and another split's regions
    scored. The rule: reading never uses such an entry (an error naming the folder, what disagrees
    and the fix); a run rebuilds it, saying so on the console, and its numbers are the uncached ones."""
    monkeypatch.setenv("XBENCH_CACHE", str(tmp_path / "cache"))
    folder = _cached_split(tmp_path / "det10").cache_folder()
    named = CACHE_CASES[case](folder, tmp_path)
    with pytest.raises(CacheDamagedError) as caught:
        ChestXDet10(root=str(tmp_path / "det10"), image_size=32, num_workers=0).setup()
    line = error_line("xbench-test", caught.value)
    assert f"the decoded-image cache {folder} is damaged: " in line and named in line, line
    assert f"Delete the folder {folder} and run again" in line and "\n" not in line and "Traceback" not in line
    capsys.readouterr()
    results = tmp_path / "results"
    with pytest.warns(UserWarning, match="rebuilding it") as warned:
        code, err = run_cli(quiet_run("centre_prior", "chestx_det10", tmp_path / "det10", results), capsys)
    assert code == 0, err
    (warning,) = [str(w.message) for w in warned if "decoded-image cache" in str(w.message)]
    assert warning.startswith(f"the decoded-image cache {folder} is damaged: ") and named in warning, warning
    assert f"Decoded-image cache rebuilt: {folder}" in err
    rebuilt = json.loads((only_folder(results) / "metrics.json").read_text())
    for section in ("grounding", "classification", "data"):
        assert rebuilt[section] == uncached_results[section], section
    assert [name for name in left_behind(folder.parent) if name.startswith(".")] == [], "a staging folder was left"


def test_a_killed_builds_staging_folder_is_never_read(tmp_path, capsys, monkeypatch, uncached_results):
    """A build killed mid-write (no clean-up ran) leaves its hidden staging folder: a run looks the
    entry up by its full name only, so it writes its own, and leaves the other (perhaps still being
    written by another process) alone."""
    monkeypatch.setenv("XBENCH_CACHE", str(tmp_path / "cache"))
    root = write_chestx_det10(tmp_path / "det10", CACHED, size=48)
    folder = ChestXDet10(root=str(root), image_size=32, num_workers=0).cache_folder()
    staging = folder.parent / f".{folder.name}.killed"
    staging.mkdir(parents=True)
    (staging / "frames.npy").write_bytes(b"\x93NUMPY half")
    datamodule = ChestXDet10(root=str(root), image_size=32, num_workers=0)
    datamodule.setup()
    assert not (folder.exists() or hasattr(datamodule.test_set, "folder")), "the staging folder was read"
    code, err = run_cli(quiet_run("centre_prior", "chestx_det10", root, tmp_path / "results"), capsys)
    assert code == 0 and f"Decoded-image cache written: {folder}" in err, err
    written = json.loads((only_folder(tmp_path / "results") / "metrics.json").read_text())
    assert all(written[section] == uncached_results[section] for section in ("grounding", "classification", "data"))
    assert left_behind(folder.parent) == sorted([staging.name, folder.name])


def test_a_stated_size_is_checked_against_the_batchs_native_size_in_a_run(wide_det10, tmp_path, capsys):
    """The image's size reaches the saved-output reader in the batch (no second read of the file):
    a size written [width, height] still stops the run, naming the file and the pair."""
    import numpy as np

    maps = _bumps()
    folder = _save_pairs(tmp_path / "saved", maps)
    np.savez(folder / "a.png" / "nodule.npz", map=maps[("a.png", "nodule")], logit=np.float32(0.5),
             window=np.array([0, 0, 48, 32]), image_size=np.array([48, 32]))
    code, err = _saved_run(wide_det10, folder, tmp_path / "results", capsys)
    assert_one_line(code, err, 1, f"{folder / 'a.png' / 'nodule.npz'} (a.png, nodule)", "image, 32 x 48",
                    "it reads as [width, height]: write [height, width]")
    assert left_behind(tmp_path / "results") == []


@pytest.mark.parametrize(("threshold", "named"), [
    ("{mass: 0.4}", "--model.native_threshold has no threshold for ['nodule']; give one per finding of the run"),
    ("1.0", "--model.native_threshold is 1.0; a threshold on the normalised map lies in [0, 1)"),
    ("{mass: 0.4, nodule: -0.1}", "--model.native_threshold for nodule is -0.1"),
])
def test_a_native_threshold_missing_or_out_of_range_is_named(wide_det10, tmp_path, capsys, threshold, named):
    """A finding without a threshold stopped the run with a bare KeyError after the loop; a threshold
    of 1 or more left every pair out of their IoU silently."""
    folder = _save_pairs(tmp_path / "saved", _bumps())
    code, err = _saved_run(wide_det10, folder, tmp_path / "results", capsys, "--model.native_protocol", "true",
                           "--model.native_threshold", threshold)
    assert_one_line(code, err, 1, named)
    assert left_behind(tmp_path / "results") == []
def test_a_config_file_name_cannot_reach_the_job_script(tmp_path):
    """A SLURM job is named after its model's config file: a line break there would start a line of
    the job's script (submitit quotes the name, and a quoted line break is still one)."""
    from types import SimpleNamespace

    from xbench.launch import Job, SubmititRun

    named = {}

    class Executor:
        def update_parameters(self, **parameters):
            named.update(parameters)

        def submit(self, function, request):
            return SimpleNamespace(paths=SimpleNamespace(stdout=tmp_path / "log"), job_id="1")

    job = Job(1, "m\n#SBATCH --output=x", [None], [{}], ["d"])
    SubmititRun(job, {}, Executor()).start(None)
    assert named["name"] == "xbench-m-SBATCH---output-x"
# -- the report's references: the paper's numbers, --reference and --fail-outside-interval (issue 41) --

REFERENCE_HEADER = "table,dataset,model,finding,metric,value_percent,decimals\n"
GOOD_ROW = "mine,phantom,centre_prior,mean,pointing_game,{value},2\n"


def _report(runs, tmp_path, capsys, *extra) -> tuple[int, str]:
    from xbench.report import main as report_main

    return run_command(report_main, [str(runs), "--out", str(tmp_path / "out"), "--replicates", "5", *extra],
                       "xbench-report", capsys)


@pytest.mark.parametrize(("content", "named"), [
    (None, "cannot be read (No such file or directory)"),
    ("", "is empty; its first line must be the header table,dataset,model,finding,metric,value_percent"),
    (REFERENCE_HEADER, "has a header but no values"),
    (REFERENCE_HEADER + "mine,phantom,centre_prior,mean\n", "line 2: 4 fields, expected 7"),
    ("table,dataset,model,finding,metric\nmine,phantom,centre_prior,mean,pointing_game\n",
     "line 1: the header is 'table,dataset,model,finding,metric'; expected table,dataset,model,finding,metric,"
     "value_percent,decimals (missing: value_percent, decimals)"),
    ("table,dataset,model,finding,metric,value_percent\nmine,phantom,centre_prior,mean,pointing_game,5\n",
     "(missing: decimals)"),
    (REFERENCE_HEADER.replace("\n", ",extra\n") + GOOD_ROW.format(value="5").replace("\n", ",1\n"),
     "(unknown: 'extra')"),
    (REFERENCE_HEADER.replace("value_percent", "value_pct") + GOOD_ROW.format(value="5"),
     "(missing: value_percent) (unknown: 'value_pct')"),
    (REFERENCE_HEADER.replace("dataset,model", "model,dataset") + GOOD_ROW.format(value="5"),
     "line 1: the header is 'table,model,dataset,finding,metric,value_percent,decimals'"),
    (REFERENCE_HEADER + GOOD_ROW.format(value="abc"), "line 2: value_percent 'abc' is not a number from 0 to 100"),
    (REFERENCE_HEADER + GOOD_ROW.format(value="120"), "line 2: value_percent '120' is not a number from 0 to 100"),
    (REFERENCE_HEADER + GOOD_ROW.format(value="-1"), "line 2: value_percent '-1' is not a number from 0 to 100"),
    (REFERENCE_HEADER + GOOD_ROW.format(value="nan"), "line 2: value_percent 'nan' is not a number"),
    (REFERENCE_HEADER + GOOD_ROW.format(value="5") + GOOD_ROW.format(value="6"),
     "line 3: the cell phantom, centre_prior, mean, pointing_game is given again (table 'mine': 6), line 2 gives it "
     "already (table 'mine': 5); a reference gives each cell once: keep one of the two rows"),
    (REFERENCE_HEADER + "mine,phantom,gpt,mean,pointing_game,5,2\n",
     "line 2: these results have no run of model 'gpt' on phantom (models run on it: centre_prior)"),
    (REFERENCE_HEADER + "mine,rsna,centre_prior,mean,pointing_game,5,2\n",
     "line 2: these results have no run of model 'centre_prior' on rsna (no run on it)"),
    (REFERENCE_HEADER + "mine,mnist,centre_prior,mean,pointing_game,5,2\n", "line 2: unknown dataset 'mnist'"),
    (REFERENCE_HEADER + "mine,phantom,centre_prior,bronchiectasis,pointing_game,5,2\n",
     "line 2: 'bronchiectasis' is not a finding of phantom; give 'mean' or one of"),
    (REFERENCE_HEADER + "mine,phantom,centre_prior,mean,accuracy,5,2\n", "line 2: unknown metric 'accuracy'"),
    (REFERENCE_HEADER + "mine,phantom,centre_prior,mean,pointing_game_tau,5,2\n", "unknown metric 'pointing_game_tau'"),
    (REFERENCE_HEADER + 'mine,phantom,"centre_prior\nrm -rf /",mean,pointing_game,5,2\n',
     "line 2: these results have no run of model 'centre_prior\\nrm -rf /'"),
    (REFERENCE_HEADER + "mine,=cmd|' /C calc'!A0,centre_prior,mean,pointing_game,5,2\n",
     "unknown dataset \"=cmd|' /C calc'!A0\""),
    (REFERENCE_HEADER.encode() + b"mine,phantom,\xff\xfe,mean,pointing_game,5,2\n", "is not UTF-8 text (byte"),
    (REFERENCE_HEADER + ",phantom,centre_prior,mean,pointing_game,5,2\n", "line 2: the table is empty"),
])
def test_a_bad_reference_is_named_and_no_report_is_written(finished_runs, tmp_path, capsys, content, named):
    reference = tmp_path / "reference.csv"
    if isinstance(content, bytes):
        reference.write_bytes(content)
    elif content is not None:
        reference.write_text(content)
    code, err = _report(finished_runs, tmp_path, capsys, "--reference", str(reference))
    assert_one_line(code, err, 2, f"reference {reference}", named)
    assert left_behind(tmp_path / "out") == []


def test_a_reference_folder_without_results_is_named(finished_runs, tmp_path, capsys):
    (tmp_path / "empty").mkdir()
    code, err = _report(finished_runs, tmp_path, capsys, "--reference", str(tmp_path / "empty"))
    assert_one_line(code, err, 2, f"--reference {tmp_path / 'empty'}: no results folders (with metrics.json) under "
                                  f"{tmp_path / 'empty'}")
    assert left_behind(tmp_path / "out") == []


def test_the_gate_needs_the_intervals(finished_runs, tmp_path, capsys):
    code, err = _report(finished_runs, tmp_path, capsys, "--no-analysis", "--fail-outside-interval")
    assert_one_line(code, err, 2, "--fail-outside-interval judges each number against its interval, which "
                                  "--no-analysis leaves out")
    assert left_behind(tmp_path / "out") == []


def test_the_demo_report_says_no_paper_cell_is_covered_and_the_gate_refuses_it(finished_runs, tmp_path, capsys):
    code, err = _report(finished_runs, tmp_path, capsys, "--fail-outside-interval")
    assert_one_line(code, err, 2, "no cell of the paper (arXiv 2510.19599) is covered by these results, so nothing "
                                  "was compared")
    text = (tmp_path / "out" / "report.md").read_text()  # the report is written before the gate
    assert ("- Reproduction of the paper (arXiv 2510.19599): 539 values in 511 cells; no cell is covered by these "
            "results") in text
    assert "## Reproduction" not in text


@pytest.mark.parametrize(("value", "status"), [("100", 1), ("{ours}", 0)])
def test_a_reference_value_outside_the_interval_fails_the_gate_naming_it(finished_runs, tmp_path, capsys, value,
                                                                         status):
    (folder,) = finished_runs.glob("centre_prior__*")
    ours = json.loads((folder / "metrics.json").read_text())["grounding"]["macro"]["pointing_game"]
    reference = tmp_path / "reference.csv"
    reference.write_text(REFERENCE_HEADER + GOOD_ROW.format(value=value.format(ours=100 * ours)))
    code, err = _report(finished_runs, tmp_path, capsys, "--reference", str(reference), "--fail-outside-interval")
    if status:
        assert_one_line(code, err, status, "1 cell(s) of `" + str(reference) + "` left XBench's interval: Phantom "
                                           f"centre_prior mean pointing_game (line 2: {value}, XBench")
    else:
        assert code == 0, err
    table = (tmp_path / "out" / "tables" / "reproduction_reference_1.md").read_text()
    (row,) = [line for line in table.splitlines() if line.startswith("| centre_prior")]
    assert row.endswith(" † |") == bool(status)


def test_a_table_label_never_names_a_file(finished_runs, tmp_path, capsys):
    reference = tmp_path / "reference.csv"
    reference.write_text(REFERENCE_HEADER + GOOD_ROW.replace("mine", "../../escaped").format(value="100"))
    code, err = _report(finished_runs, tmp_path, capsys, "--reference", str(reference))
    assert code == 0, err
    assert not list(tmp_path.rglob("escaped*"))
    assert "Reproduction: ../../escaped" in (tmp_path / "out" / "tables" / "reproduction_reference_1.md").read_text()
# -- transformers CLIP/SigLIP folders (issue 41) ------------------------------------------------
# A folder is read only when every file it needs is there, readable, and agrees with the others:
# before, a CLIP folder without its tokenizer files ran with exit 0 on an empty vocabulary.

@pytest.fixture(scope="module")
def hf_folders(tmp_path_factory):
    """A tiny CLIP (the legacy ``eos_token_id: 2`` of XrayCLIP's config) and SigLIP folder, as the hub holds them."""
    from test_hf_dual_encoder import TINY
    from xbench.models.random_weights import write_hf_dual_encoder

    root = tmp_path_factory.mktemp("hf_folders")
    return {family: write_hf_dual_encoder(root / family, *TINY[family], seed=0) for family in TINY}


def _hf_remove(*names):
    return lambda folder: [(folder / name).unlink() for name in names]


def _hf_truncate(name, keep=None):
    def damage(folder):
        data = (folder / name).read_bytes()
        (folder / name).write_bytes(data[: len(data) // 2 if keep is None else keep])
    return damage


def _hf_write(name, text):
    return lambda folder: (folder / name).write_text(text)


def _hf_edit(name, change):
    def damage(folder):
        settings = json.loads((folder / name).read_text())
        change(settings)
        (folder / name).write_text(json.dumps(settings))
    return damage


def _hf_tensor(key, value):
    def damage(folder):
        from safetensors.torch import load_file, save_file

        weights = load_file(str(folder / "model.safetensors"))
        weights[key].view(-1)[0] = value
        save_file(weights, str(folder / "model.safetensors"), metadata={"format": "pt"})
    return damage


def _hf_siglip_tokenizer_in_clip(folder):
    """A SigLIP tokenizer (spiece.model and its tokenizer_config.json) in place of the CLIP's."""
    from xbench.models.random_weights import write_siglip_tokenizer

    (folder / "tokenizer.json").unlink()
    write_siglip_tokenizer(folder)


def _hf_added_token(folder):
    from transformers import AutoTokenizer

    tokenizer = AutoTokenizer.from_pretrained(str(folder), local_files_only=True)
    tokenizer.add_tokens(["<extra>"])
    tokenizer.save_pretrained(str(folder))


def _hf_foreign_letters(folder):
    """Another vocabulary of the same size: the SentencePiece model's letters and digits become CJK characters."""
    from sentencepiece import sentencepiece_model_pb2 as spm

    proto = spm.ModelProto()
    proto.ParseFromString((folder / "spiece.model").read_bytes())
    for piece in proto.pieces:
        if len(piece.piece) == 1 and piece.piece.isalnum():
            piece.piece = chr(0x4E00 + ord(piece.piece))
    (folder / "spiece.model").write_bytes(proto.SerializeToString())


MISSING_TOKENIZER = ("no clip tokenizer in {folder}: it needs tokenizer.json or vocab.json and merges.txt",
                     "copy the checkpoint's tokenizer files there")
NO_PROCESSOR = ("no image processor settings in {folder}", "processor_config.json with an image_processor entry",
                "its save_pretrained writes processor_config.json")
HF_CASES = {
    # missing and swapped files
    "no tokenizer files": ("clip", _hf_remove("tokenizer.json", "tokenizer_config.json"), MISSING_TOKENIZER),
    "tokenizer_config.json alone (was: an empty vocabulary, every logit 0.0)": (
        "clip", _hf_remove("tokenizer.json"), MISSING_TOKENIZER),
    "SigLIP's tokenizer in a CLIP folder": ("clip", _hf_siglip_tokenizer_in_clip, MISSING_TOKENIZER),
    "no spiece.model": ("siglip", _hf_remove("spiece.model"),
                        ("no siglip tokenizer in {folder}: it needs spiece.model",)),
    "no image processor settings": ("siglip", _hf_remove("preprocessor_config.json"), NO_PROCESSOR),
    "processor_config.json without an image_processor": (
        "siglip", lambda folder: (_hf_remove("preprocessor_config.json")(folder),
                                  _hf_write("processor_config.json", '{"processor_class": "X"}')(folder)),
        NO_PROCESSOR),
    # truncated and wrong-shaped files
    "truncated config.json": ("clip", _hf_truncate("config.json"),
                              ("{folder}/config.json is not valid JSON", "Download or write it again")),
    "config.json a list": ("clip", _hf_write("config.json", "[1, 2]"),
                           ("{folder}/config.json holds a JSON list", "fetch the checkpoint's own file")),
    "truncated tokenizer.json": ("clip", _hf_truncate("tokenizer.json"),
                                 ("{folder}/tokenizer.json is not valid JSON",)),
    "truncated spiece.model": ("siglip", _hf_truncate("spiece.model"),
                               ("cannot read the tokenizer in {folder}", "spiece.model",
                                "fetch the checkpoint's tokenizer files again")),
    "truncated preprocessor_config.json": ("clip", _hf_truncate("preprocessor_config.json"),
                                           ("{folder}/preprocessor_config.json is not valid JSON",)),
    "truncated processor_config.json": ("clip", _hf_write("processor_config.json", '{"image_processor": {"size"'),
                                        ("{folder}/processor_config.json is not valid JSON",)),
    "image_processor a list": ("clip", _hf_write("processor_config.json", '{"image_processor": [224]}'),
                               ("{folder}/processor_config.json has an image_processor that is not an object",)),
    "model.safetensors cut in its header": ("clip", _hf_truncate("model.safetensors", keep=4),
                                            ("{folder}/model.safetensors", "header too small", "fetch it again")),
    "model.safetensors cut in its tensors": ("siglip", _hf_truncate("model.safetensors"),
                                             ("{folder}/model.safetensors", "not fully covered", "fetch it again")),
    # values out of range, of the wrong type, or injected
    "NaN in visual_projection.weight": ("clip", _hf_tensor("visual_projection.weight", float("nan")),
                                        ("the weights in {folder}", "NaN or inf in visual_projection.weight",
                                         "fetch the checkpoint again")),
    "inf in logit_bias": ("siglip", _hf_tensor("logit_bias", float("inf")),
                          ("the weights in {folder}", "NaN or inf in logit_bias")),
    "vision_config.image_size a string": (
        "clip", _hf_edit("config.json", lambda c: c["vision_config"].update(image_size="big")),
        ("cannot load CLIPModel from {folder}", "image_size", "check its config.json against the checkpoint's own")),
    "text_config.vocab_size negative": (
        "clip", _hf_edit("config.json", lambda c: c["text_config"].update(vocab_size=-3)),
        ("cannot load CLIPModel from {folder}", "negative dimension")),
    "eos_token_id not the tokenizer's": (
        "clip", _hf_edit("config.json", lambda c: c["text_config"].update(eos_token_id=5)),
        ("the tokenizer in {folder} ends prompts with id 49407", "pools id 5 (config.json eos_token_id)")),
    "a token added to the tokenizer": ("clip", _hf_added_token,
                                       ("the tokenizer in {folder} has 49409 ids", "text tower embeds ids 0 to 49407",
                                        "use the checkpoint's own tokenizer files")),
    "another vocabulary of the same size": ("siglip", _hf_foreign_letters,
                                            ("the tokenizer in {folder} reads the prompt",
                                             "special or unknown tokens only", "--model.pos_template")),
    "resample a string": ("clip", _hf_edit("preprocessor_config.json", lambda c: c.update(resample="x")),
                          ("{folder}/preprocessor_config.json: a setting that is not a number", "'x'")),
    "crop_size negative": (
        "clip", _hf_edit("preprocessor_config.json", lambda c: c.update(crop_size={"height": -4, "width": -4})),
        ("{folder}/preprocessor_config.json: crop_size", "XBench crops a positive square")),
    "an image processor transformers does not have": (
        "siglip", _hf_edit("preprocessor_config.json", lambda c: c.update(image_processor_type="NoSuchProcessor")),
        ("{folder}/preprocessor_config.json: transformers cannot build its image processor",
         "Unrecognized image processor")),
    "pad_token null": ("clip", _hf_edit("tokenizer_config.json", lambda c: c.update(pad_token=None)),
                       ("the tokenizer in {folder} has no pad_token",)),
}


@pytest.mark.parametrize("case", HF_CASES)
def test_a_transformers_folder_that_does_not_hold_together_is_named(hf_folders, phantom_root, tmp_path, capsys,
                                                                      case):
    import shutil

    family, damage, named = HF_CASES[case]
    folder = tmp_path / family
    shutil.copytree(hf_folders[family], folder)
    damage(folder)
    config = "xray_clip" if family == "clip" else "medsiglip"
    code, err = run_cli(quiet_run(config, "phantom", phantom_root, tmp_path / "results", "--model.checkpoint_dir",
                                  str(folder)), capsys)
    assert_one_line(code, err, 1, *(name.format(folder=folder) for name in named))
    assert left_behind(tmp_path / "results") == []


def test_code_named_in_a_folders_files_is_never_run(hf_folders, tmp_path):
    """``auto_map`` entries in the config, the image processor's and the tokenizer's settings point at a
    module in the folder: XBench builds transformers' own classes and imports nothing from the folder."""
    import shutil

    from xbench.models.hf_dual_encoder import HFDualEncoder

    folder = tmp_path / "clip"
    shutil.copytree(hf_folders["clip"], folder)
    marker = tmp_path / "ran"
    (folder / "evil.py").write_text(f"open({str(marker)!r}, 'w').close()\nclass Evil: pass\n")
    for name, auto in (("config.json", "AutoModel"), ("preprocessor_config.json", "AutoImageProcessor"),
                       ("tokenizer_config.json", "AutoTokenizer")):
        _hf_edit(name, lambda c, auto=auto: c.update(auto_map={auto: "evil.Evil"}))(folder)
    model = HFDualEncoder(str(folder))
    model.build(["nodule"])
    assert not marker.exists()
    assert type(model.model).__name__ == "CLIPModel" and type(model.tokenizer).__name__ == "CLIPTokenizer"


ROBUSTNESS_NOISE = "must be a number above 0 and at most 1000; got"


@pytest.mark.parametrize(("extra", "status", "named"), [
    (("--robustness.samples",), 2, "argument --robustness.samples: expected one argument"),
    (("--robustness.samples", "0"), 1, "--robustness.samples must be a whole number from 1 to 10000; got 0"),
    (("--robustness.samples", "-2"), 1, "--robustness.samples must be a whole number from 1 to 10000; got -2"),
    (("--robustness.samples", "10001"), 1, "--robustness.samples must be a whole number from 1 to 10000; got 10001"),
    (("--robustness.samples", "1.5"), 2, "option 'robustness.samples': Expected a <class 'int'>. Got value: 1.5"),
    (("--robustness.samples", "abc"), 2, "option 'robustness.samples': Expected a <class 'int'>. Got value: abc"),
    (("--robustness.samples", "true"), 2, "option 'robustness.samples': Expected a <class 'int'>. Got value: True"),
    (("--robustness.radius", "0"), 1, f"--robustness.radius {ROBUSTNESS_NOISE} 0.0"),
    (("--robustness.radius", "-0.1"), 1, f"--robustness.radius {ROBUSTNESS_NOISE} -0.1"),
    (("--robustness.radius", ".nan"), 1, f"--robustness.radius {ROBUSTNESS_NOISE} nan"),
    (("--robustness.radius", ".inf"), 1, f"--robustness.radius {ROBUSTNESS_NOISE} inf"),
    (("--robustness.radius", "1e4"), 1, f"--robustness.radius {ROBUSTNESS_NOISE} 10000.0"),
    (("--robustness.radius", "nan"), 2, "option 'robustness.radius': Expected a <class 'float'>. Got value: nan"),
    (("--robustness.radius", "abc"), 2, "option 'robustness.radius': Expected a <class 'float'>. Got value: abc"),
    (("--robustness.radius", "true"), 2, "option 'robustness.radius': Expected a <class 'float'>. Got value: True"),
    (("--robustness.std", "0"), 1, f"--robustness.std {ROBUSTNESS_NOISE} 0.0"),
    (("--robustness.std", "-1"), 1, f"--robustness.std {ROBUSTNESS_NOISE} -1.0"),
    (("--robustness.std", ".nan"), 1, f"--robustness.std {ROBUSTNESS_NOISE} nan"),
    (("--robustness.std", ".inf"), 1, f"--robustness.std {ROBUSTNESS_NOISE} inf"),
    (("--robustness.std", "1001"), 1, f"--robustness.std {ROBUSTNESS_NOISE} 1001.0"),
    (("--robustness.std=-inf",), 2, "option 'robustness.std': Expected a <class 'float'>. Got value: -inf"),
    (("--robustness.std", "abc"), 2, "option 'robustness.std': Expected a <class 'float'>. Got value: abc"),
    (("--robustness.seed", "-1"), 1,
     "--robustness.seed must be a whole number from 0 to 4294967295 (the range of --seed_everything); got -1"),
    (("--robustness.seed", "4294967296"), 1, "--robustness.seed must be a whole number from 0 to 4294967295"),
    (("--robustness.images", "-1"), 1, "--robustness.images must be 0 (off) or a number of images; got -1"),
    (("--robustness.images", "1.0"), 2, "option 'robustness.images': Expected a <class 'int'>. Got value: 1.0"),
])
def test_a_robustness_option_beyond_what_it_can_mean_is_named(phantom_root, tmp_path, capsys, extra, status, named):
    """Each of ``--robustness.*`` refused before the first batch, in one line with the range and the value:
    a count out of range, noise of no spread, NaN, infinite or drowning the image, a seed beyond
    ``--seed_everything``'s range (exit 1); a string or a bool where a number belongs, or no value
    (the parser's usage error, exit 2)."""
    code, err = run_cli(quiet_run("centre_prior", "phantom", phantom_root, tmp_path / "results", *extra), capsys)
    assert_one_line(code, err, status, named)
    assert left_behind(tmp_path / "results") == []


# -- the reference gate judges every cell it is given (issue 48) --
# Before, a cell given under two table labels (one value 81 pp off) was "inconsistent" and unjudged, so
# --fail-outside-interval passed; a second --reference silently replaced the first; a reference in
# fractions flagged every cell without a word; a BOM, a named pipe, a 2 GB file and an Oracle row were
# refused with the wrong reason or not at all; and a broken reference exited 1 like a moved number.

def _ours(runs, metric="pointing_game") -> float:
    """CentrePrior's mean ``metric`` on the phantom, in percent."""
    (folder,) = runs.glob("centre_prior__*")
    return 100 * json.loads((folder / "metrics.json").read_text())["grounding"]["macro"][metric]


def _reference(tmp_path, rows: str, name="reference.csv"):
    path = tmp_path / name
    path.write_text(REFERENCE_HEADER + rows)
    return path


@pytest.mark.parametrize("second", ["other", "mine"])
def test_a_cell_given_twice_is_refused_naming_both_lines_and_never_passes_the_gate(finished_runs, tmp_path, capsys,
                                                                                   second):
    """One cell under two table labels (or one twice), one value 81 pp off: an error naming both lines, exit 2,
    never an unjudged "inconsistent" cell that lets the gate pass."""
    ours = _ours(finished_runs)
    off = (ours + 81) % 100
    rows = GOOD_ROW.format(value=f"{ours:.2f}") + GOOD_ROW.replace("mine", second).format(value=f"{off:.2f}")
    reference = _reference(tmp_path, rows)
    code, err = _report(finished_runs, tmp_path, capsys, "--reference", str(reference), "--fail-outside-interval")
    assert_one_line(code, err, 2, f"reference {reference}, line 3: the cell phantom, centre_prior, mean, pointing_game "
                                  f"is given again (table '{second}'", "line 2 gives it already (table 'mine'",
                    "a reference gives each cell once: keep one of the two rows")
    assert left_behind(tmp_path / "out") == []


def test_a_second_reference_is_refused_naming_both(finished_runs, tmp_path, capsys):
    first = _reference(tmp_path, GOOD_ROW.format(value="5"), "a.csv")
    second = _reference(tmp_path, GOOD_ROW.format(value="6"), "b.csv")
    code, err = _report(finished_runs, tmp_path, capsys, "--reference", str(first), "--reference", str(second),
                        "--fail-outside-interval")
    assert_one_line(code, err, 2, f"--reference is given 2 times ({first}, {second})", "combine them into one CSV")
    assert left_behind(tmp_path / "out") == []


def test_a_reference_in_fractions_is_refused_saying_so(finished_runs, tmp_path, capsys):
    """0.61 for 61 %: every value within [0, 1] where XBench's are percentages, which times 100 they match."""
    rows = "".join(GOOD_ROW.replace("pointing_game", metric).format(value=f"{_ours(finished_runs, metric) / 100:.4f}")
                   for metric in ("pointing_game", "dice@best", "iou@best"))
    assert max(_ours(finished_runs, metric) for metric in ("pointing_game", "dice@best", "iou@best")) > 2
    reference = _reference(tmp_path, rows)
    code, err = _report(finished_runs, tmp_path, capsys, "--reference", str(reference), "--fail-outside-interval")
    assert_one_line(code, err, 2, f"reference {reference}: every value_percent lies from 0 to 1, and times 100 they "
                                  "lie near XBench's values (line 2:", "fractions, where value_percent is in percent; "
                                  "multiply the values by 100")
    assert left_behind(tmp_path / "out") == []


def test_small_values_that_match_xbench_are_no_fractions(finished_runs, tmp_path, capsys):
    """All within [0, 1] % is no error where XBench's values are as small: the cell is judged."""
    assert _ours(finished_runs) < 0.5
    reference = _reference(tmp_path, GOOD_ROW.format(value=f"{_ours(finished_runs) + 0.5:.2f}"))
    code, err = _report(finished_runs, tmp_path, capsys, "--reference", str(reference), "--fail-outside-interval")
    assert_one_line(code, err, 1, "1 cell(s) of `" + str(reference) + "` left XBench's interval")


def test_a_reference_with_a_byte_order_mark_is_read(finished_runs, tmp_path, capsys):
    reference = tmp_path / "reference.csv"
    reference.write_bytes(b"\xef\xbb\xbf" + (REFERENCE_HEADER + GOOD_ROW.format(value="100")).encode())
    code, err = _report(finished_runs, tmp_path, capsys, "--reference", str(reference), "--fail-outside-interval")
    assert_one_line(code, err, 1, "1 cell(s) of `" + str(reference) + "` left XBench's interval: Phantom centre_prior "
                                  "mean pointing_game (line 2: 100, XBench")
    assert (tmp_path / "out" / "tables" / "reproduction_reference_1.md").exists()


def test_a_reference_that_is_not_a_small_regular_file_is_refused_before_it_is_read(finished_runs, tmp_path, capsys):
    """A named pipe hung in ``open``; a 2 GB file ended in a MemoryError. Both are named, with the size."""
    import os

    pipe = tmp_path / "pipe.csv"
    os.mkfifo(pipe)
    code, err = _report(finished_runs, tmp_path, capsys, "--reference", str(pipe))
    assert_one_line(code, err, 2, f"reference {pipe} is a named pipe, not a file: name the file itself")
    huge = tmp_path / "huge.csv"
    with open(huge, "wb") as handle:
        handle.truncate(2 * 2**30)  # sparse: no disk used
    code, err = _report(finished_runs, tmp_path, capsys, "--reference", str(huge))
    assert_one_line(code, err, 2, f"reference {huge} is 2,147,483,648 bytes; a reference is a small table, read up "
                                  "to 8 MiB")
    assert left_behind(tmp_path / "out") == []


def test_an_instrument_row_is_refused_as_a_ceiling_not_as_a_missing_run(finished_runs, tmp_path, capsys):
    reference = _reference(tmp_path, "mine,phantom,oracle,mean,pointing_game,5,2\n")
    code, err = _report(finished_runs, tmp_path, capsys, "--reference", str(reference), "--fail-outside-interval")
    assert_one_line(code, err, 2, f"reference {reference}, line 2: 'oracle' on phantom is an instrument, which reads "
                                  "the answer: a ceiling shown for scale, never judged against a reference")
    assert "no run" not in err
    assert left_behind(tmp_path / "out") == []


@pytest.mark.parametrize("decimals", ["", "x", "-1", "2.5", "11"])
def test_a_value_without_a_stated_precision_is_refused(finished_runs, tmp_path, capsys, decimals):
    """A CSV states each value's precision (``decimals``); it is never read off how the value is written."""
    reference = _reference(tmp_path, GOOD_ROW.replace(",2\n", f",{decimals}\n").format(value="5"))
    code, err = _report(finished_runs, tmp_path, capsys, "--reference", str(reference))
    assert_one_line(code, err, 2, f"reference {reference}, line 2: decimals {decimals!r} is not a whole number from 0 "
                                  "to 10; give the digits after the point the source prints")
    assert left_behind(tmp_path / "out") == []


@pytest.mark.parametrize(("decimals", "status"), [("0", 0), ("2", 1)])
def test_a_values_tolerance_is_its_stated_precision(finished_runs, tmp_path, capsys, decimals, status):
    """The same text 0.4 pp above XBench's interval: inside at decimals 0 (+-0.5 pp), outside at 2 (+-0.005)."""
    import csv

    row = GOOD_ROW.replace("pointing_game", "dice@best")
    code, err = _report(finished_runs, tmp_path / "first", capsys, "--reference",
                        str(_reference(tmp_path, row.format(value="100"), "first.csv")))
    assert code == 0, err
    with open(tmp_path / "first" / "out" / "tables" / "reproduction_reference_1.csv") as handle:
        (table,) = list(csv.DictReader(handle))
    high = max(float(value) for column, value in table.items() if column.endswith(("XBench", "XBench high")))
    reference = _reference(tmp_path, row.replace(",2\n", f",{decimals}\n").format(value=f"{high + 0.4:.4f}"))
    code, err = _report(finished_runs, tmp_path, capsys, "--reference", str(reference), "--fail-outside-interval")
    if status:
        assert_one_line(code, err, 1, "1 cell(s) of `" + str(reference) + "` left XBench's interval")
    else:
        assert code == 0, err


def test_a_moved_number_exits_1_and_a_bad_reference_2(finished_runs, tmp_path, capsys):
    """A CI job tells a broken reference (exit 2) from a number that moved (exit 1)."""
    moved = _reference(tmp_path, GOOD_ROW.format(value="100"), "moved.csv")
    code, err = _report(finished_runs, tmp_path, capsys, "--reference", str(moved), "--fail-outside-interval")
    assert_one_line(code, err, 1, "left XBench's interval")
    broken = _reference(tmp_path, GOOD_ROW.format(value="abc"), "broken.csv")
    code, err = _report(finished_runs, tmp_path / "broken", capsys, "--reference", str(broken),
                        "--fail-outside-interval")
    assert_one_line(code, err, 2, "xbench-report: error: reference", "value_percent 'abc' is not a number")
    assert left_behind(tmp_path / "broken" / "out") == []


# -- only regular files are read; named messages (issue 48) --

import errno  # noqa: E402
import re  # noqa: E402
import os  # noqa: E402
import signal  # noqa: E402
import subprocess  # noqa: E402
import sys  # noqa: E402
import tempfile  # noqa: E402
from contextlib import contextmanager  # noqa: E402
from pathlib import Path  # noqa: E402

from xbench.inspect_checkpoint import main as inspect_main  # noqa: E402
from xbench.suite import main as suite_main  # noqa: E402


@contextmanager
def _no_hang(seconds: int = 60):
    """A named pipe that is opened blocks for ever: a regression fails the test instead of hanging CI."""
    def hung(signum, frame):
        pytest.fail(f"still running after {seconds} s: a named pipe was opened")  # a BaseException: not caught by cli.run

    previous = signal.signal(signal.SIGALRM, hung)
    signal.alarm(seconds)
    try:
        yield
    finally:
        signal.alarm(0)
        signal.signal(signal.SIGALRM, previous)


def _pipe(path):
    """A named pipe at ``path`` (which must not exist yet)."""
    os.mkfifo(path)
    return path


def _sparse(path, size: int = 2 * 1024**3):
    """A file of ``size`` bytes (2 GiB) that takes no disk: a hole."""
    with open(path, "wb") as file:
        file.truncate(size)
    return path


def _folder(path):
    path.mkdir()
    return path


def _det10_with(tmp_path, relative: str, make):
    """A two-image ChestX-Det10 whose ``relative`` path is replaced by what ``make`` puts there."""
    root = det10_root(tmp_path, [ENTRY, {"file_name": "b.png", "syms": [], "boxes": []}])
    (root / relative).unlink()
    make(root / relative)
    return root


@pytest.mark.parametrize(("relative", "make", "named"), [
    ("test.json", _pipe, "test.json is a named pipe, not a file"),
    ("test.json", _folder, "test.json is a folder, not a file"),
    ("test.json", _sparse, "test.json holds 2,048 MiB, more than the 1,024 MiB XBench reads from such a file"),
    ("test_data/a.png", _pipe, "a.png is a named pipe, not a file"),
    ("test_data/a.png", _folder, "a.png is a folder, not a file"),
])
@pytest.mark.parametrize("cache", ["true", "false"])
def test_a_dataset_file_that_is_no_regular_file_is_named(tmp_path, capsys, relative, make, named, cache):
    root = _det10_with(tmp_path, relative, make)
    with _no_hang():
        code, err = run_cli(quiet_run("centre_prior", "chestx_det10", root, tmp_path / "results", "--data.cache", cache),
                            capsys)
    assert_one_line(code, err, 1, str(root / relative), named)
    assert left_behind(tmp_path / "results") == []


@pytest.mark.parametrize(("make", "named"), [
    (_pipe, "is a named pipe, not a file"),
    (_folder, "is a folder, not a file"),
    (_sparse, "holds 2,048 MiB, more than the 64 MiB XBench reads from such a file"),
])
def test_a_config_that_is_no_regular_file_is_named(phantom_root, tmp_path, capsys, make, named):
    config = make(tmp_path / "model.yaml")
    args = quiet_run("centre_prior", "phantom", phantom_root, tmp_path / "results")
    args[args.index(str(CONFIGS_DIR / "models" / "centre_prior.yaml"))] = str(config)
    with _no_hang():
        code, err = run_cli(args, capsys)
    assert_one_line(code, err, 2, f"--config {config} {named}")
    assert left_behind(tmp_path / "results") == []


def test_a_device_as_a_config_is_named(phantom_root, tmp_path, capsys):
    """/dev/zero never ends: read whole, it was a MemoryError."""
    args = quiet_run("centre_prior", "phantom", phantom_root, tmp_path / "results", "--config", "/dev/zero")
    with _no_hang():
        code, err = run_cli(args, capsys)
    assert_one_line(code, err, 2, "--config /dev/zero is a character device, not a file")


@pytest.mark.parametrize(("make", "named"), [(_pipe, "is a named pipe, not a file"),
                                             (_folder, "is a folder, not a file")])
def test_a_checkpoint_that_is_no_regular_file_is_named(tmp_path, capsys, make, named):
    checkpoint = make(tmp_path / "model.pt")
    with _no_hang():
        code, err = run_command(inspect_main, [str(checkpoint)], "xbench-inspect-checkpoint", capsys)
    assert_one_line(code, err, 1, f"{checkpoint} {named}")


def _suite_file(tmp_path, models: str, datasets: str | None = None, results: str = "results"):
    """``suite.yaml`` in ``tmp_path`` (the working folder) running ``models`` on the phantom."""
    datasets = datasets or f"[{{config: {CONFIGS_DIR / 'data' / 'phantom.yaml'}, settings: {{data.num_images: 2}}}}]"
    (tmp_path / "suite.yaml").write_text(f"results_dir: {results}\nmodels: {models}\ndatasets: {datasets}\n")
    return tmp_path / "suite.yaml"


@pytest.mark.parametrize(("make", "named"), [
    (_pipe, "suite.yaml is a named pipe, not a file"),
    (_sparse, "suite.yaml holds 2,048 MiB, more than the 64 MiB XBench reads from such a file"),
])
def test_a_suite_file_that_is_no_regular_file_is_named(tmp_path, capsys, monkeypatch, make, named):
    monkeypatch.chdir(tmp_path)
    make(tmp_path / "suite.yaml")
    with _no_hang():
        code, err = run_command(suite_main, ["--config", "suite.yaml"], "xbench-suite", capsys)
    assert_one_line(code, err, 1, named)


def test_a_suites_model_config_that_is_a_named_pipe_is_named(tmp_path, capsys, monkeypatch):
    monkeypatch.chdir(tmp_path)
    _pipe(tmp_path / "m.yaml")
    _suite_file(tmp_path, "[m.yaml]")
    with _no_hang():
        code, err = run_command(suite_main, ["--config", "suite.yaml"], "xbench-suite", capsys)
    assert_one_line(code, err, 1, "m.yaml is a named pipe, not a file")
    assert left_behind(tmp_path / "results") == []


@pytest.mark.parametrize(("make", "named"), [
    (_pipe, "metrics.json is a named pipe, not a file"),
    (_sparse, "metrics.json holds 2,048 MiB, more than the 64 MiB XBench reads from such a file"),
])
def test_a_results_folders_metrics_json_that_is_no_regular_file_is_named_by_the_suite(tmp_path, capsys, monkeypatch,
                                                                                      make, named):
    monkeypatch.chdir(tmp_path)
    (tmp_path / "results" / "old_run").mkdir(parents=True)
    make(tmp_path / "results" / "old_run" / "metrics.json")
    _suite_file(tmp_path, f"[{CONFIGS_DIR / 'models' / 'centre_prior.yaml'}]")
    damaged = re.escape(f"{Path('results') / 'old_run' / 'metrics.json'} {named.removeprefix('metrics.json ')}")
    with _no_hang(), pytest.warns(UserWarning, match=f"damaged, e.g. {damaged}.*count as not done and run again"):
        code, err = run_command(suite_main, ["--config", "suite.yaml", "--dry-run"], "xbench-suite", capsys)
    assert code == 0, err  # not this version's result: its pair runs again, the warning says why


@pytest.mark.skipif(not Path("/proc/self/status").exists(), reason="reads its address space from /proc")
def test_running_out_of_memory_is_one_line_with_the_fix(tmp_path):
    """The last resort, through ``python -m xbench.test``'s own ending: an annotation file under its
    cap (900 MiB, sparse) read by a process allowed 1 GiB more address space than its imports took."""
    root = _det10_with(tmp_path, "test.json", lambda path: _sparse(path, 900 * 2**20))
    script = (
        "import resource, xbench.test\n"
        "size = next(int(line.split()[1]) * 1024 for line in open('/proc/self/status') if line.startswith('VmSize:'))\n"
        "resource.setrlimit(resource.RLIMIT_AS, (size + 2**30, resource.getrlimit(resource.RLIMIT_AS)[1]))\n"
        "xbench.test.cli()\n"
    )
    args = quiet_run("centre_prior", "chestx_det10", root, tmp_path / "results")
    done = subprocess.run([sys.executable, "-c", script, *args], capture_output=True, text=True, timeout=300,
                          env={**os.environ, "XBENCH_DEBUG": "0"})
    assert_one_line(done.returncode, done.stderr, 1, "xbench-test: error: this machine ran out of memory",
                    "--data.batch_size")
    assert "MemoryError" not in done.stderr, done.stderr
    assert left_behind(tmp_path / "results") == []


def _read_only(folder, monkeypatch):
    """``folder`` read-only: by its mode; as root, whom modes do not stop, by the error a read-only
    file system gives for a file made in it."""
    folder.mkdir(parents=True, exist_ok=True)
    if os.geteuid() != 0:
        folder.chmod(0o555)
        return
    made = tempfile.TemporaryFile

    def refused(*args, dir=None, **kwargs):
        if dir is not None and Path(dir) == folder:
            raise OSError(errno.EROFS, os.strerror(errno.EROFS))
        return made(*args, dir=dir, **kwargs)

    monkeypatch.setattr(tempfile, "TemporaryFile", refused)


def test_a_read_only_results_folder_names_the_option_and_the_fix(phantom_root, tmp_path, capsys, monkeypatch):
    _read_only(tmp_path / "results", monkeypatch)
    code, err = run_cli(quiet_run("centre_prior", "phantom", phantom_root, tmp_path / "results"), capsys)
    assert_one_line(code, err, 1, f"--results.folder {tmp_path / 'results'} is not a folder XBench can write in "
                    "(read-only to this user", "give --results.folder a folder you can write in")
    assert "[Errno" not in err, err


def test_a_read_only_suite_results_dir_names_the_suite_file(tmp_path, capsys, monkeypatch):
    monkeypatch.chdir(tmp_path)
    _read_only(tmp_path / "results", monkeypatch)
    _suite_file(tmp_path, f"[{CONFIGS_DIR / 'models' / 'centre_prior.yaml'}]", results=str(tmp_path / "results"))
    code, err = run_command(suite_main, ["--config", "suite.yaml"], "xbench-suite", capsys)
    assert_one_line(code, err, 1, f"results_dir (in suite.yaml) {tmp_path / 'results'} is not a folder XBench can "
                    "write in (read-only to this user")
    assert "[Errno" not in err, err


@pytest.mark.parametrize("case", ["a file", "read-only"])
def test_an_unusable_xbench_cache_names_the_variable_and_the_fix(phantom_root, tmp_path, capsys, monkeypatch, case):
    cache = tmp_path / "cache"
    if case == "a file":
        cache.write_text("not a folder")
    else:
        _read_only(cache, monkeypatch)
    monkeypatch.setenv("XBENCH_CACHE", str(cache))
    code, err = run_cli(quiet_run("centre_prior", "phantom", phantom_root, tmp_path / "results", "--data.cache", "true"),
                        capsys)
    why = f"{cache} is a file" if case == "a file" else "read-only to this user"
    assert_one_line(code, err, 1, f"XBENCH_CACHE {cache} is not a folder XBench can write in ({why}",
                    "set XBENCH_CACHE to a folder you can write in")
    assert "[Errno" not in err, err
    assert left_behind(tmp_path / "results") == []


def test_the_phantom_in_an_unusable_xbench_cache_names_the_variable(tmp_path, capsys, monkeypatch):
    (tmp_path / "cache").write_text("not a folder")
    monkeypatch.setenv("XBENCH_CACHE", str(tmp_path / "cache"))
    args = quiet_run("centre_prior", "phantom", tmp_path, tmp_path / "results", "--data.cache", "false")
    del args[args.index("--data.root"):args.index("--data.root") + 2]  # the phantom's default root: in the cache
    code, err = run_cli(args, capsys)
    assert_one_line(code, err, 1, f"XBENCH_CACHE {tmp_path / 'cache'} is not a folder XBench can write in")


@pytest.mark.parametrize(("second", "lines"), [
    ("MODEL", "lines 3 and 5"),  # the same path twice
    ("./MODEL_NAME", "lines 3 and 5"),  # another spelling of the path
    ("copy.yaml", "lines 3 and 5"),  # a copy under another name: the same config
])
def test_a_model_listed_twice_is_refused_naming_both_lines(tmp_path, capsys, monkeypatch, second, lines):
    monkeypatch.chdir(tmp_path)
    model = CONFIGS_DIR / "models" / "centre_prior.yaml"
    (tmp_path / model.name).write_text(model.read_text())
    (tmp_path / "copy.yaml").write_text(model.read_text())
    second = second.replace("MODEL_NAME", model.name).replace("MODEL", model.name)
    (tmp_path / "suite.yaml").write_text(
        f"results_dir: results\nmodels:\n  - {model.name}\n  - {{config: {model.name}, settings: {{data.image_size: 32}}}}"
        f"\n  - {second}\ndatasets: [{CONFIGS_DIR / 'data' / 'phantom.yaml'}]\n")
    code, err = run_command(suite_main, ["--config", "suite.yaml", "--dry-run"], "xbench-suite", capsys)
    assert_one_line(code, err, 1, f"suite.yaml, {lines}: models[0] (centre_prior) and models[2]",
                    "are the same model, the same config and settings, so each of its pairs would run twice: keep one")
    assert left_behind(tmp_path / "results") == []


def test_a_dataset_listed_twice_is_refused_and_other_settings_are_not(tmp_path, capsys, monkeypatch):
    monkeypatch.chdir(tmp_path)
    data = CONFIGS_DIR / "data" / "phantom.yaml"
    _suite_file(tmp_path, f"[{CONFIGS_DIR / 'models' / 'centre_prior.yaml'}]",
                f"\n  - {{config: {data}, settings: {{data.seed: 1}}}}\n  - {{config: {data}, settings: {{data.seed: 2}}}}"
                f"\n  - {{config: {data}, settings: {{data.seed: 1}}}}")
    code, err = run_command(suite_main, ["--config", "suite.yaml", "--dry-run"], "xbench-suite", capsys)
    assert_one_line(code, err, 1, "suite.yaml, lines 4 and 6: datasets[0] (phantom) and datasets[2] (phantom) are "
                    "the same dataset")


@pytest.mark.parametrize(("make", "named"), [(_pipe, "is a named pipe, not a file"),
                                             (_folder, "is a folder, not a file")])
def test_a_saved_map_that_is_no_regular_file_is_named_not_missing(wide_det10, tmp_path, capsys, make, named):
    """Looked for by name, it was "no saved map" (or skipped); opened, a named pipe hung."""
    (tmp_path / "saved" / "a.png").mkdir(parents=True)
    saved = make(tmp_path / "saved" / "a.png" / "mass.npz")
    with _no_hang():
        code, err = _saved_run(wide_det10, tmp_path / "saved", tmp_path / "results", capsys)
    assert_one_line(code, err, 1, f"{saved} {named}")
    assert left_behind(tmp_path / "results") == []


# -- RadZero's folder (issue 52) --
# The folder is read only when every file is there, readable and RadZero's: each damage below stops
# the run with one line naming the folder, the file or the tensor, and the fix.

@pytest.fixture(scope="module")
def radzero_folder(tmp_path_factory):
    """A RadZero folder with one vision block, the two extra blocks and one text block."""
    from xbench.models.random_weights import write_radzero

    return write_radzero(tmp_path_factory.mktemp("radzero_folder"), vision_layers=1, text_layers=1)


def _rz_state_edit(edit):
    def damage(folder):
        from safetensors.torch import load_file, save_file

        state = load_file(str(folder / "model.safetensors"))
        edit(state)
        save_file(state, str(folder / "model.safetensors"))
    return damage


def _rz_nan(state):
    state["loss_fns.RadZeroLoss.layer_norm.weight"][3] = float("nan")


def _rz_another_architecture(folder):
    """A BERT's weights where RadZero's should be (another model's checkpoint under the name)."""
    from safetensors.torch import save_file
    from transformers import BertConfig, BertModel

    bert = BertModel(BertConfig(vocab_size=60, hidden_size=32, num_hidden_layers=1, num_attention_heads=2,
                                intermediate_size=64))
    save_file({key: value.contiguous() for key, value in bert.state_dict().items()}, str(folder / "model.safetensors"))


RADZERO_CASES = {
    "no tokenizer files": (_hf_remove("vocab.txt"),
                           ("RadZero: no tokenizer in {folder}", "tokenizer.json or vocab.txt", "copy them there")),
    "no preprocessor_config.json": (_hf_remove("preprocessor_config.json"),
                                    ("RadZero: preprocessor_config.json not found in {folder}",)),
    "no model.safetensors": (_hf_remove("model.safetensors"), ("RadZero: model.safetensors not found in {folder}",)),
    "another architecture's weights": (_rz_another_architecture,
                                       ("checkpoint {folder}/model.safetensors does not match RadZeroNet",
                                        "missing in the file", "unexpected in the file", "config.json")),
    "another model's config.json": (_hf_write("config.json", json.dumps({"model_type": "clip", "projection_dim": 512})),
                                    ("RadZero: {folder}/config.json is not the published RadZero recipe",
                                     "compute_logits_type is missing")),
    "a text_config without MPNet's architecture": (
        _hf_edit("config.json", lambda c: c.update(text_config={"use_text_projection": False, "use_cls_token": False,
                                                        "pretrained_name_or_path": "all-mpnet-base-v2"})),
        ("RadZero: {folder}/config.json has no text_config with hidden_size", "docs/models/radzero.md")),
    "NaN weights": (_rz_state_edit(_rz_nan),
                    ("RadZero: {folder}/model.safetensors: NaN or inf in loss_fns.RadZeroLoss.{{layer_norm.weight}}",
                     "fetch the checkpoint again")),
    "a truncated model.safetensors": (_hf_truncate("model.safetensors"),
                                      ("cannot read checkpoint {folder}/model.safetensors",
                                       "damaged or truncated .safetensors file")),
    "another model's tokenizer": (_hf_edit("config.json", lambda c: c["text_config"].update(pad_token_id=0)),
                                  ("the tokenizer in {folder} (pad id 1", "is not the text tower's (pad id 0",
                                   "use the checkpoint's own tokenizer files")),
    "another image processor": (_hf_edit("preprocessor_config.json",
                                         lambda c: c.update(image_processor_type="BitImageProcessor")),
                                ("RadZero: {folder}/preprocessor_config.json: image_processor_type 'BitImageProcessor'",
                                 "XrayDINOv2's BlipImageProcessor")),
    "a damaged config.json": (_hf_truncate("config.json", keep=40), ("{folder}/config.json",)),
}


@pytest.mark.parametrize("case", RADZERO_CASES)
def test_a_radzero_folder_that_does_not_hold_together_is_named(radzero_folder, phantom_root, tmp_path, capsys, case):
    import shutil

    damage, named = RADZERO_CASES[case]
    folder = shutil.copytree(radzero_folder, tmp_path / "radzero")
    damage(folder)
    code, err = run_cli(quiet_run("radzero", "phantom", phantom_root, tmp_path / "results", "--model.checkpoint_dir",
                                  str(folder)), capsys)
    assert_one_line(code, err, 1, *(name.format(folder=folder) for name in named))
    assert left_behind(tmp_path / "results") == []


# -- a results folder checks itself (issue 48) ----------------------------------------------------
#
# Each edit below was once read and reported with exit 0. Plain, the folder's manifest refuses it;
# resealed (the manifest rewritten from the edited files, `conftest.reseal`), the check behind the
# manifest does: a value's range, the graded pairs, the constant maps counted, the estimates re-derived.

def _results_copy(finished_runs, tmp_path):
    """A copy of the finished runs to damage, and its Centre Prior folder."""
    import shutil

    copy = tmp_path / "results"
    shutil.copytree(finished_runs, copy)
    (folder,) = copy.glob("centre_prior__*")
    return copy, folder


def _set_cell(file: str, column: str, value: str, row: int = 1):
    """An edit of one cell of a table: data row ``row`` (1: the first) of ``column``."""
    def change(lines):
        at = lines[0].split(",").index(column)
        cells = lines[row].split(",")
        cells[at] = value
        return [*lines[:row], ",".join(cells), *lines[row + 1:]]
    return lambda folder: _edit_table(folder, file, _lines(change))


def _move_to_an_ungraded_class(folder):
    """The first row of ``localisation.csv.gz`` moved to a class its image has no graded pair of."""
    import pandas as pd

    pairs = pd.read_csv(folder / "pairs.csv.gz", usecols=["image_id", "class", "graded"], dtype=str)
    classes = json.loads((folder / "metrics.json").read_text())["classes"]

    def change(lines):
        image_id = lines[1].split(",")[1]
        graded = set(pairs[(pairs.image_id == image_id) & (pairs.graded == "True")]["class"])
        other = next(c for c in classes if c not in graded)
        cells = lines[1].split(",")
        cells[2] = other
        return [lines[0], ",".join(cells), *lines[2:]]
    _edit_table(folder, "localisation.csv.gz", _lines(change))


def _double_localisation(payload):
    section = payload["localisation"]
    keys = ("relevance_mass", "relevance_rank", "top_k_intersection", "pixel_auc")
    double = lambda values: {k: 2 * v if k in keys and v is not None else v for k, v in values.items()}  # noqa: E731
    section["macro"] = double(section["macro"])
    section["per_class"] = {c: double(values) for c, values in section["per_class"].items()}
    return payload


def _swap_pairs(folder):
    """``pairs.csv.gz`` swapped with the Oracle's folder beside it."""
    (other,) = folder.parent.glob("oracle__*")
    mine = (folder / "pairs.csv.gz").read_bytes()
    (folder / "pairs.csv.gz").write_bytes((other / "pairs.csv.gz").read_bytes())
    (other / "pairs.csv.gz").write_bytes(mine)


def _graded_cell(column: str, value: str):
    """An edit of ``pairs.csv.gz``: ``column`` of the first graded pair set to ``value``."""
    def change(lines):
        header = lines[0].split(",")
        row = next(i for i, line in enumerate(lines) if line.split(",")[header.index("graded")] == "True")
        cells = lines[row].split(",")
        cells[header.index(column)] = value
        return [*lines[:row], ",".join(cells), *lines[row + 1:]]
    return lambda folder: _edit_table(folder, "pairs.csv.gz", _lines(change))


#: case -> (the file edited, the edit, the file the check behind the manifest names, what it says).
EDITS = {
    "relevance mass 7.5": ("localisation.csv.gz", _set_cell("localisation.csv.gz", "relevance_mass", "7.5"),
                           "localisation.csv.gz",
                           "data row 2, column relevance_mass: 7.5 lies outside its range [0, 1]"),
    "pixel AUC -0.5": ("localisation.csv.gz", _set_cell("localisation.csv.gz", "pixel_auc", "-0.5"),
                       "localisation.csv.gz", "data row 2, column pixel_auc: -0.5 lies outside its range [0, 1]"),
    "a row moved to an ungraded class": ("localisation.csv.gz", _move_to_an_ungraded_class, "localisation.csv.gz",
                                         "data row 2: (00000.png, "),
    "a constant_map flag flipped": ("localisation.csv.gz", _set_cell("localisation.csv.gz", "constant_map", "True"),
                                    "localisation.csv.gz", "constant maps of "),
    "a hit of 2": ("pairs.csv.gz", _graded_cell("hit", "2"), "pairs.csv.gz", "hit must be 0 or 1"),
    "a region larger than the frame": ("pairs.csv.gz", _graded_cell("region_px", "5000"), "pairs.csv.gz",
                                       "at most the frame's 1024 pixels"),
    "the localisation section doubled": ("metrics.json", lambda f: _edit_json(f, _double_localisation), "metrics.json",
                                         "but the folder's records (localisation.csv.gz) give"),
    "the Pointing Game set to 0.95": ("metrics.json", lambda f: _edit_json(f, lambda p: {**p, "grounding": {
        **p["grounding"], "macro": {**p["grounding"]["macro"], "pointing_game": 0.95}}}), "metrics.json",
        "grounding.macro.pointing_game is 0.95, but the folder's records (pairs.csv.gz) give 0"),
    "pairs.csv.gz from another model": ("pairs.csv.gz", _swap_pairs, "metrics.json",
                                        "pointing_game is 0.0, but the folder's records (pairs.csv.gz) give 1"),
    "a section deleted": ("metrics.json", lambda f: _edit_json(
        f, lambda p: {k: v for k, v in p.items() if k != "localisation"}), "localisation.csv.gz",
        "is present, but metrics.json has no applicable localisation section"),
}


def _command(command: str, copy, tmp_path, capsys) -> tuple[int, str]:
    """One of `COMMANDS` on ``copy`` in-process, writing under ``tmp_path / "out"``: its exit status and stderr."""
    import importlib

    name, *extra = COMMANDS[command]
    module = importlib.import_module(f"xbench.{name}")
    return run_command(module.main, [str(copy), "--out", str(tmp_path / "out"), *extra], f"xbench-{name}", capsys)


COMMANDS = {"report": ("report", "--replicates", "5"), "report --no-analysis": ("report", "--no-analysis"),
            "analyze": ("analyze", "--replicates", "5")}


@pytest.mark.parametrize("command", COMMANDS)
@pytest.mark.parametrize("case", EDITS)
def test_an_edited_results_folder_is_refused_by_its_manifest(finished_runs, tmp_path, capsys, case, command):
    """The edit is named by the file it changed, before any number of the folder is used."""
    file_name, edit, _, _ = EDITS[case]
    copy, folder = _results_copy(finished_runs, tmp_path)
    edit(folder)
    code, err = _command(command, copy, tmp_path, capsys)
    assert_one_line(code, err, 1, str(folder / file_name), "is not the file the run wrote",
                    "re-run that model on that dataset")
    assert left_behind(tmp_path / "out") == []


@pytest.mark.parametrize("command", ["report", "analyze"])
@pytest.mark.parametrize("case", EDITS)
def test_a_resealed_edit_is_refused_by_the_check_behind_the_manifest(finished_runs, tmp_path, capsys, case, command):
    """With the manifest rewritten to fit (by hand, or a bug of XBench's), the analysis still refuses
    the folder: each per-pair value in its metric's range, each table's pairs the graded pairs, the
    constant maps as counted, and the estimates it re-derives equal to metrics.json's."""
    _, edit, named_file, named = EDITS[case]
    copy, folder = _results_copy(finished_runs, tmp_path)
    edit(folder)
    for each in copy.iterdir():
        reseal(each)
    code, err = _command(command, copy, tmp_path, capsys)
    assert_one_line(code, err, 1, str(folder / named_file), named, "re-run that model on that dataset")
    assert left_behind(tmp_path / "out") == []


def _fifo_in_place_of(name: str):
    """A named pipe in ``name``'s place (or added, where the folder has none): opening it would wait
    for a writer for ever."""
    import os

    def damage(folder):
        (folder / name).unlink(missing_ok=True)
        os.mkfifo(folder / name)
    return damage


def _manifest_entry(name: str, change):
    def damage(folder):
        manifest = json.loads((folder / "manifest.json").read_text())
        change(manifest["files"], name)
        (folder / "manifest.json").write_text(json.dumps(manifest))
    return damage


#: case -> (the file named, the damage, what the error says).
MANIFEST_DAMAGE = {
    "no manifest": ("manifest.json", lambda f: (f / "manifest.json").unlink(), "manifest.json is missing"),
    "a manifest not JSON": ("manifest.json", lambda f: (f / "manifest.json").write_text("{files"), "is not valid JSON"),
    "a manifest without files": ("manifest.json", lambda f: (f / "manifest.json").write_text('{"schema": 3}'),
                                 "'files' is missing or not a dict"),
    "an entry without its hash": ("manifest.json", _manifest_entry("pairs.csv.gz", lambda files, n: files[n].pop(
        "sha256")), "files['pairs.csv.gz'] is not a file of the folder with its 'bytes'"),
    "an entry outside the folder": ("manifest.json", _manifest_entry("../x", lambda files, n: files.update(
        {n: files["summary.md"]})), "files['../x'] is not a file of the folder"),
    "a listed file missing": ("summary.md", lambda f: (f / "summary.md").unlink(),
                              "is missing, but manifest.json lists it"),
    "a file truncated": ("config.yaml", lambda f: (f / "config.yaml").write_bytes((f / "config.yaml").read_bytes()[:9]),
                         "is not the file the run wrote (9 bytes"),
    "a table added by hand": ("sanity.csv.gz", lambda f: (f / "sanity.csv.gz").write_bytes(
        (f / "complexity.csv.gz").read_bytes()), "is not listed in"),
    "a named pipe for a table": ("localisation.csv.gz", _fifo_in_place_of("localisation.csv.gz"),
                                 "localisation.csv.gz is a named pipe, not a file"),
    "a named pipe for the manifest": ("manifest.json", _fifo_in_place_of("manifest.json"),
                                      "manifest.json is a named pipe, not a file"),
    "a named pipe added": ("queries.csv.gz", _fifo_in_place_of("queries.csv.gz"), "is not listed in"),
}


@pytest.mark.parametrize("command", COMMANDS)
@pytest.mark.parametrize("case", MANIFEST_DAMAGE)
def test_a_folder_that_does_not_fit_its_manifest_is_named(finished_runs, tmp_path, capsys, case, command):
    """Every reader checks the folder against its manifest first: the manifest missing or of the
    wrong shape, a listed file missing or changed, a file XBench writes present but not listed, and
    anything but a regular file in a file's place -- refused, never opened (a pipe would hang)."""
    file_name, damage, named = MANIFEST_DAMAGE[case]
    copy, folder = _results_copy(finished_runs, tmp_path)
    damage(folder)
    code, err = _command(command, copy, tmp_path, capsys)
    assert_one_line(code, err, 1, str(folder / file_name), named, "re-run that model on that dataset")
    assert left_behind(tmp_path / "out") == []


@pytest.mark.parametrize("command", COMMANDS)
def test_a_folder_without_its_metrics_is_named_not_dropped(finished_runs, tmp_path, capsys, command):
    """A deleted metrics.json once dropped the model from every table without a word."""
    copy, folder = _results_copy(finished_runs, tmp_path)
    (folder / "metrics.json").unlink()
    code, err = _command(command, copy, tmp_path, capsys)
    assert_one_line(code, err, 1, f"{folder} holds a run's files but no metrics.json", "re-run that model")
    assert left_behind(tmp_path / "out") == []


@pytest.mark.parametrize("command", COMMANDS)
def test_a_folder_of_the_previous_schema_is_refused_as_another_versions(finished_runs, tmp_path, capsys, command):
    """A folder written before the manifest (schema xbench.results/2, no manifest.json) is named as
    another version's, with its fix, not as damaged."""
    copy, folder = _results_copy(finished_runs, tmp_path)
    (folder / "manifest.json").unlink()
    _edit_json(folder, lambda p: {**p, "schema": "xbench.results/2"})
    code, err = _command(command, copy, tmp_path, capsys)
    assert_one_line(code, err, 1, str(folder / "metrics.json"), "schema 'xbench.results/2', expected "
                    "'xbench.results/4'; it was written by another XBench version -- re-run that model")
    assert left_behind(tmp_path / "out") == []


def test_the_suite_runs_again_a_pair_whose_folder_was_edited(tmp_path):
    """The suite counts a run done only by a folder that passes `read_results`: an edited one is
    not this version's result, and the warning names it."""
    from xbench.suite import existing_results

    results = tmp_path / "results"
    folder = results / "a__b__1"
    folder.mkdir(parents=True)
    (folder / "metrics.json").write_text(json.dumps({"schema": "xbench.results/4", "model": "a", "dataset": "b",
                                                     "classes": [], "data": {}, "config": {"model": {}},
                                                     "names": {"model": "a", "dataset": "b", "findings": {}}}))
    reseal(folder)
    assert existing_results(results) == [(folder, {"model": {}})]
    (folder / "metrics.json").write_text((folder / "metrics.json").read_text().replace('"a"', '"c"'))
    with pytest.warns(UserWarning, match=r"written by another XBench version .* or are damaged, e\.g\. .*a__b__1"
                                         r"/metrics\.json is not the file the run wrote"):
        assert existing_results(results) == []


@pytest.fixture(scope="module")
def robust_run(phantom_root, tmp_path_factory):
    """A run with the robustness check (its table: max-sensitivity and the local Lipschitz estimate)."""
    from conftest import CONFIGS

    results = tmp_path_factory.mktemp("robust") / "results"
    main(["--model", "test_checks.TinyConv", "--config", str(CONFIGS / "data" / "phantom.yaml"),
          "--data.root", str(phantom_root), "--data.image_size", "32", "--data.num_workers", "0",
          "--results.folder", str(results), "--trainer.enable_progress_bar", "false", "--trainer.logger", "false",
          "--robustness.images", "2", "--robustness.samples", "2"])
    return results


@pytest.mark.parametrize(("column", "value", "plain"), [
    ("max_sensitivity", "-1", True), ("max_sensitivity", "-1", False), ("local_lipschitz", "-0.5", False)])
def test_a_robustness_value_below_zero_is_named(robust_run, tmp_path, capsys, column, value, plain):
    import shutil

    copy = tmp_path / "results"
    shutil.copytree(robust_run, copy)
    (folder,) = copy.iterdir()
    _set_cell("robustness.csv.gz", column, value)(folder)
    if not plain:
        reseal(folder)
    code, err = _command("analyze", copy, tmp_path, capsys)
    named = ("is not the file the run wrote" if plain
             else f"data row 2, column {column}: {float(value)!r} lies outside its range [0, inf]")
    assert_one_line(code, err, 1, str(folder / "robustness.csv.gz"), named, "re-run that model on that dataset")
    assert left_behind(tmp_path / "out") == []


def test_each_table_and_arrays_file_is_checked_again_as_it_is_read(finished_runs, tmp_path):
    """`read_table` and `read_overlays` check their file against the manifest themselves: a file
    changed after the folder was verified, or a listed one deleted, is named (never read, or taken
    for a run that saved none)."""
    from xbench.results.folder import read_overlays, read_table

    _, folder = _results_copy(finished_runs, tmp_path)
    _edit_pairs(folder, lambda text: text.replace(b",True,", b",False,", 1))
    with pytest.raises(ValueError, match="pairs.csv.gz is not the file the run wrote"):
        read_table(folder / "pairs.csv.gz")
    (folder / "overlays.npz").unlink()
    with pytest.raises(ValueError, match="overlays.npz is missing, but manifest.json lists it"):
        read_overlays(folder)
    assert read_overlays(folder, "sanity_maps.npz") is None  # none saved, none listed


# -- a results folder names its own findings and model (issue 50) --

NAMES_EDITS = {
    "no names": (lambda p: {k: v for k, v in p.items() if k != "names"},
                 "'names' is missing or not a dict holding model, dataset, findings"),
    "names a list": (lambda p: {**p, "names": ["centre_prior"]},
                     "'names' is missing or not a dict holding model, dataset, findings"),
    "no findings": (lambda p: {**p, "names": {"model": "m", "dataset": "d"}},
                    "'names' is missing or not a dict holding model, dataset, findings"),
    "model a number": (lambda p: {**p, "names": {**p["names"], "model": 7}},
                       "names.model is missing or not a non-empty string"),
    "dataset blank": (lambda p: {**p, "names": {**p["names"], "dataset": " "}},
                      "names.dataset is missing or not a non-empty string"),
    "findings a list": (lambda p: {**p, "names": {**p["names"], "findings": ["nodule"]}},
                        "names.findings is missing or not a dict"),
    "a class missing": (lambda p: {**p, "names": {**p["names"], "findings": {}}},
                        "names.findings['nodule'] is missing or lacks its 'display' and 'short' names"),
    "a short name null": (lambda p: {**p, "names": {**p["names"], "findings": {
        **p["names"]["findings"], "mass": {"display": "Mass", "short": None}}}},
        "names.findings['mass'] is missing or lacks its 'display' and 'short' names"),
}


@pytest.mark.parametrize("command", COMMANDS)
@pytest.mark.parametrize("case", NAMES_EDITS)
def test_a_folder_without_its_names_is_refused_naming_the_field(finished_runs, tmp_path, capsys, case, command):
    """What the report, the analysis and W&B show a run by is read from its folder: names that are
    missing or of the wrong type are named, field by field, before any table is drawn (resealed, so
    the manifest does not catch the edit first)."""
    copy, folder = _results_copy(finished_runs, tmp_path)
    change, named = NAMES_EDITS[case]
    _edit_json(folder, change)
    reseal(folder)
    code, err = _command(command, copy, tmp_path, capsys)
    assert_one_line(code, err, 1, str(folder / "metrics.json"), named, "re-run that model on that dataset")
    assert left_behind(tmp_path / "out") == []


PUBLISHED_HEADER = "table,dataset,model,finding,metric,value_percent,decimals\n"
BAD_PUBLISHED = {
    "no header": ("phantom,theirs,mean,pointing_game,5,2\n", "line 1: the header is"),
    "an unknown dataset": (PUBLISHED_HEADER + "A,mnist,theirs,mean,pointing_game,5,2\n",
                           "line 2: unknown dataset 'mnist'"),
    "a finding the dataset lacks": (PUBLISHED_HEADER + "A,phantom,theirs,bronchiectasis,pointing_game,5,2\n",
                                    "line 2: 'bronchiectasis' is not a finding of phantom"),
    "a value out of range": (PUBLISHED_HEADER + "A,phantom,theirs,mean,pointing_game,150,2\n",
                             "line 2: value_percent '150' is not a number from 0 to 100"),
    "no decimals": (PUBLISHED_HEADER + "A,phantom,theirs,mean,pointing_game,5,two\n",
                    "line 2: decimals 'two' is not a whole number"),
    "a cell given twice": (PUBLISHED_HEADER + "A,phantom,theirs,mean,pointing_game,5,2\n"
                           "B,phantom,theirs,mean,pointing_game,6,2\n", "line 3: the cell phantom, theirs, mean"),
}


@pytest.mark.parametrize("case", BAD_PUBLISHED)
def test_a_bad_published_csv_is_an_input_error_naming_the_line(finished_runs, tmp_path, capsys, case):
    """``--published FILE`` is read by the reference readers: a bad row is named by its line, exit 2,
    before the analysis runs or a report is written."""
    from xbench.report import main as report_main

    text, named = BAD_PUBLISHED[case]
    table = tmp_path / "published.csv"
    table.write_text(text)
    code, err = run_command(report_main, [str(finished_runs), "--out", str(tmp_path / "out"), "--no-analysis",
                                          "--published", str(table)], "xbench-report", capsys)
    assert_one_line(code, err, 2, f"--published: reference {table}", named)
    assert left_behind(tmp_path / "out") == []


@pytest.mark.parametrize("value", ["papers", "nowhere/published.csv", "."])
def test_an_unknown_published_value_is_a_usage_error(finished_runs, tmp_path, capsys, value):
    """Neither ``paper`` nor a file: named, with both forms it takes."""
    from xbench.report import main as report_main

    code, err = run_command(report_main, [str(finished_runs), "--out", str(tmp_path / "out"), "--no-analysis",
                                          "--published", value], "xbench-report", capsys)
    assert_one_line(code, err, 2, f"--published {value!r} is neither 'paper' nor a file",
                    "give '--published paper' (the paper's Tables 1-5) or a CSV with the columns table, dataset")
    assert left_behind(tmp_path / "out") == []


# -- signals set, not inherited (issue 48) --

from xbench import launch  # noqa: E402

#: A process's answer to whether a SIGINT would raise KeyboardInterrupt in it.
HEARS_SIGINT = "import signal; print(signal.getsignal(signal.SIGINT) is signal.default_int_handler)"


def hears_sigint(**popen) -> bool:
    return subprocess.run([sys.executable, "-c", HEARS_SIGINT], capture_output=True, text=True, check=True,
                          **popen).stdout.strip() == "True"


def test_the_jobs_of_a_launcher_that_ignores_sigint_hear_it():
    """A suite started where SIGINT is ignored (a background job of a shell without job control) keeps
    ignoring it, while the processes it starts for its jobs -- a local job (`launch._bound_to`),
    submitit's local job (`launch._starting_with_sigint`) -- begin with SIGINT at its default, so its
    cancel stops them; a process started otherwise inherits the ignored SIGINT, as exec passes it on."""
    previous = signal.signal(signal.SIGINT, signal.SIG_IGN)
    try:
        assert not hears_sigint()
        assert hears_sigint(preexec_fn=launch._bound_to(os.getpid()))
        with launch._starting_with_sigint():
            assert hears_sigint()
            os.kill(os.getpid(), signal.SIGINT)  # caught and dropped: no KeyboardInterrupt here
        assert signal.getsignal(signal.SIGINT) is signal.SIG_IGN
    finally:
        signal.signal(signal.SIGINT, previous)


# -- hub ids resolved offline (issue 50) --------------------------------------------------------
# ``--model.checkpoint_dir hf-hub:<org>/<name>[@revision]`` is the snapshot the local Hugging Face
# cache holds, found by huggingface_hub's own lookup with sockets blocked; every way it can be
# wrong is named with its fix, and the download command where the cache lacks something.

from conftest import COMMIT, only_folder, write_snapshot  # noqa: E402

OTHER_COMMIT = "fedcba9876543210fedcba9876543210fedcba98"


@pytest.mark.parametrize(("suffix", "commit"), [("", COMMIT), ("@main", COMMIT), ("@v1.1", OTHER_COMMIT),
                                                (f"@{OTHER_COMMIT}", OTHER_COMMIT), (f"@{COMMIT}", COMMIT)])
def test_a_hub_id_is_its_snapshot_in_the_local_cache(hub_cache, no_network, suffix, commit):
    """By the hub's default branch, a branch or tag by name, a commit hash: the snapshot, offline."""
    from xbench.models.hub import checkpoint_folder

    write_snapshot(hub_cache, "org/model", {"config.json": b"{}"})
    write_snapshot(hub_cache, "org/model", {"config.json": b"{}", "weights.bin": b"w"}, OTHER_COMMIT, refs=("v1.1",))
    folder = checkpoint_folder(f"hf-hub:org/model{suffix}")
    assert folder == (hub_cache / "models--org--model" / "snapshots" / commit).resolve()
    assert (folder / "config.json").read_bytes() == b"{}"


@pytest.mark.slow  # a fresh interpreter: the hub library reads HF_HOME as it is imported
def test_a_hub_id_follows_hf_home_in_a_fresh_interpreter(tmp_path):
    """Without ``HF_HUB_CACHE``, the cache is ``$HF_HOME/hub``: the hub library's own rule, read as it starts."""
    import os
    import subprocess
    import sys

    snapshot = write_snapshot(tmp_path / "home" / "hub", "org/model", {"config.json": b"{}"})
    env = {key: value for key, value in os.environ.items() if key != "HF_HUB_CACHE"}
    code = "from xbench.models.hub import checkpoint_folder; print(checkpoint_folder('hf-hub:org/model'))"
    result = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=300,
                            env={**env, "HF_HOME": str(tmp_path / "home")})
    assert result.returncode == 0 and result.stdout.strip() == str(snapshot.resolve()), result.stderr


@pytest.mark.parametrize(("value", "problem"), [
    ("hf-hub:", "exactly one / between the organisation and the name"),
    ("hf-hub:a", "exactly one / between the organisation and the name"),
    ("hf-hub:a/b/c", "exactly one / between the organisation and the name"),
    ("hf-hub:../b", "Repo id must use alphanumeric chars"),
    ("hf-hub:a/..", "Repo id must use alphanumeric chars"),
    ("hf-hub:a/b@../../../etc", "'../../../etc' is not a branch, tag or commit hash"),
    ("hf-hub:a/b@", "'' is not a branch, tag or commit hash"),
])
def test_a_malformed_hub_id_is_a_usage_error_naming_the_form(phantom_root, hub_cache, tmp_path, capsys, no_network,
                                                             value, problem):
    status, err = run_cli(quiet_run("medsiglip", "phantom", phantom_root, tmp_path / "results",
                                    "--model.checkpoint_dir", value), capsys)
    assert_one_line(status, err, 2, f"--model.checkpoint_dir {value!r} is not a hub id", problem,
                    "Write hf-hub:<org>/<name>[@revision]")
    assert left_behind(tmp_path / "results") == []


@pytest.mark.parametrize(("value", "held", "command"), [
    ("hf-hub:org/absent", "does not hold org/absent", "hf download org/absent (or"),
    ("hf-hub:org/model@v9", "holds org/model but not its revision v9", "hf download org/model --revision v9"),
    (f"hf-hub:org/model@{OTHER_COMMIT}", f"holds org/model but not its revision {OTHER_COMMIT}",
     f"hf download org/model --revision {OTHER_COMMIT}"),
])
def test_a_hub_id_the_cache_lacks_is_named_with_its_download_command(phantom_root, hub_cache, tmp_path, capsys,
                                                                     no_network, value, held, command):
    write_snapshot(hub_cache, "org/model", {"config.json": b"{}"})
    status, err = run_cli(quiet_run("medsiglip", "phantom", phantom_root, tmp_path / "results",
                                    "--model.checkpoint_dir", value), capsys)
    assert_one_line(status, err, 1, f"--model.checkpoint_dir {value}: the Hugging Face cache {hub_cache}", held,
                    f"Download it where a network is: {command}")
    assert left_behind(tmp_path / "results") == []


def test_a_snapshot_lacking_a_needed_file_names_the_command_that_fetches_it(phantom_root, hub_cache, tmp_path,
                                                                           capsys, no_network):
    """CLIP's snapshot with its config only (``hf download`` of one file, the wrong one)."""
    snapshot = write_snapshot(hub_cache, "timm/vit_base_patch16_clip_224.openai", {"open_clip_config.json": b"{}"})
    status, err = run_cli(quiet_run("clip", "phantom", phantom_root, tmp_path / "results", "--model.checkpoint_dir",
                                    "hf-hub:timm/vit_base_patch16_clip_224.openai"), capsys)
    assert_one_line(status, err, 1, f"none of open_clip_model.safetensors, open_clip_pytorch_model.bin found in "
                    f"{snapshot.resolve()}", "Download them into the cache: hf download "
                    f"timm/vit_base_patch16_clip_224.openai open_clip_model.safetensors --revision {COMMIT}")
    assert left_behind(tmp_path / "results") == []


def test_a_file_missing_in_a_snapshot_subfolder_is_named_by_its_path_in_the_repository(hub_cache):
    from xbench.models.text import require_files

    snapshot = write_snapshot(hub_cache, "org/model", {"Bio_ClinicalBERT/config.json": b"{}"})
    with pytest.raises(FileNotFoundError, match="hf download org/model Bio_ClinicalBERT/vocab.txt --revision "
                                                f"{COMMIT}"):
        require_files(snapshot / "Bio_ClinicalBERT", ("config.json", "vocab.txt"), "a BERT")


def test_the_suite_marks_a_hub_id_the_cache_lacks_missing_with_its_command(hub_cache, tmp_path, capsys, monkeypatch,
                                                                          no_network):
    from xbench.suite import main as suite_main

    monkeypatch.chdir(tmp_path)
    model = CONFIGS_DIR / "models" / "medsiglip.yaml"
    _suite_file(tmp_path, f"[{{config: {model}, settings: {{model.checkpoint_dir: 'hf-hub:google/medsiglip-448'}}}}]")
    suite_main(["--config", "suite.yaml", "--dry-run"])
    out = " ".join(capsys.readouterr().out.split())
    assert "missing" in out and "hf download google/medsiglip-448" in out, out


@pytest.mark.slow  # a fresh interpreter: the hub library reads HF_HUB_CACHE as it is imported
def test_a_model_runs_from_a_hub_id_through_python_m_xbench_test(phantom_root, tmp_path, monkeypatch):
    """A tiny SigLIP folder with random weights as ``google/medsiglip-448``'s snapshot in the cache, run
    as a user would (``python -m xbench.test``), every socket and name lookup refused; the run is named
    by its config, and a bare config names it after the repository, not the commit hash."""
    from test_hf_dual_encoder import TINY
    from test_offline import run_guarded

    from xbench.models.random_weights import write_hf_dual_encoder

    folder = write_hf_dual_encoder(tmp_path / "tiny", *TINY["siglip"], seed=0)
    files = {path.name: path.read_bytes() for path in folder.iterdir()}
    write_snapshot(tmp_path / "hf-cache", "google/medsiglip-448", files)
    monkeypatch.setenv("HF_HUB_CACHE", str(tmp_path / "hf-cache"))
    (tmp_path / "bare.yaml").write_text("model:\n  class_path: xbench.models.hf_dual_encoder.HFDualEncoder\n")
    for config, name in ((CONFIGS_DIR / "models" / "medsiglip.yaml", "medsiglip"), (tmp_path / "bare.yaml",
                                                                                    "medsiglip-448")):
        args = run_args("medsiglip", "phantom", phantom_root, tmp_path / name, "--trainer.logger", "false",
                        "--model.checkpoint_dir", "hf-hub:google/medsiglip-448", image_size=32)
        args[1] = str(config)
        result = run_guarded(f"import runpy, sys\nsys.argv = ['xbench.test', *{args!r}]\n"
                             "runpy.run_module('xbench.test', run_name='__main__')", tmp_path)
        output = result.stdout + result.stderr
        assert result.returncode == 0 and "NETWORK CALL" not in output, output[-3000:]
        payload = json.loads((only_folder(tmp_path / name) / "metrics.json").read_text())
        assert payload["model"] == name and payload["data"]["images_evaluated"] == 9


# =============================================================================================
# Issue 49.3/49.6: VinDr-CXR's readers scored against each other (readers: leave_one_out) -- a
# reader id no image has, options that need leave_one_out, an image read by one radiologist.
# =============================================================================================

def vindr_train(root, boxes, labels):
    from test_vindr import ramp, write_physionet

    images = {image_id: dict(pixels=ramp(12, 30), bits_stored=12) for image_id, _, _ in labels}
    return write_physionet(root, "train", images, boxes, labels)


VINDR_BOXES = [("v1", "R1", "Cardiomegaly", (10.0, 10.0, 30.0, 20.0)), ("v1", "R2", "No finding", None),
               ("v1", "R10", "Cardiomegaly", (12.0, 8.0, 28.0, 22.0))]
VINDR_LABELS = [("v1", "R1", {"Cardiomegaly": 1}), ("v1", "R2", {"No finding": 1}), ("v1", "R10", {"Cardiomegaly": 1})]


@pytest.mark.parametrize(("extra", "named"), [
    (("--data.readers", "leave_one_out", "--data.reader", "R99"),
     ("--data.reader 'R99' read no image of", "image_labels_train.csv", "the readers present are R1, R2, R10")),
    (("--data.reader", "R1"), ("--data.reader R1 applies only to --data.readers leave_one_out",)),
    (("--data.readers", "majority", "--data.reference", "union"),
     ("--data.reference union applies only to --data.readers leave_one_out",)),
    (("--data.readers", "leave_one_out", "--data.reference", "both"),
     ("option 'reference': Expected a typing.Literal['union', 'majority']",)),
])
def test_vindr_reader_options_are_named(tmp_path, capsys, extra, named):
    root = vindr_train(tmp_path / "vindr", VINDR_BOXES, VINDR_LABELS)
    args = quiet_run("human", "vindr", root, tmp_path / "results", "--data.split", "train", *extra)
    code, err = run_cli(args, capsys)
    assert code in (1, 2) and all(name in err for name in named) and "Traceback" not in err, err
    assert left_behind(tmp_path / "results") == []


def test_vindr_leave_one_out_needs_the_train_split_and_human_needs_it(tmp_path, capsys):
    root = vindr_train(tmp_path / "vindr", VINDR_BOXES, VINDR_LABELS)
    code, err = run_cli(quiet_run("human", "vindr", root, tmp_path / "results", "--data.readers", "leave_one_out"),
                        capsys)
    assert_one_line(code, err, 1, "--data.readers leave_one_out needs --data.split train")
    code, err = run_cli(quiet_run("human", "vindr", root, tmp_path / "results", "--data.split", "train"), capsys)
    assert_one_line(code, err, 1, "--model human scores a second reader, and VinDrCXR as configured has none")
    assert left_behind(tmp_path / "results") == []


def test_vindr_a_reader_id_holding_the_read_separator_is_named(tmp_path, capsys):
    boxes = [*VINDR_BOXES[:2], ("v1", "R#3", "No finding", None)]
    labels = [*VINDR_LABELS[:2], ("v1", "R#3", {"No finding": 1})]
    root = vindr_train(tmp_path / "vindr", boxes, labels)
    args = quiet_run("human", "vindr", root, tmp_path / "results", "--data.split", "train",
                     "--data.readers", "leave_one_out")
    code, err = run_cli(args, capsys)
    assert_one_line(code, err, 1, "image_labels_train.csv, line 4", "'R#3'", "rename the reader")


def test_vindr_an_image_read_once_is_a_counted_skip(tmp_path):
    """Leave-one-out needs another reader: an image with one is skipped, warned and counted."""
    boxes = [*VINDR_BOXES, ("v2", "R1", "Cardiomegaly", (1.0, 1.0, 9.0, 9.0))]
    labels = [*VINDR_LABELS, ("v2", "R1", {"Cardiomegaly": 1})]
    root = vindr_train(tmp_path / "vindr", boxes, labels)
    with pytest.warns(UserWarning, match="skipped 1 images of .*image_labels_train.csv read by one radiologist"):
        results = main(quiet_run("human", "vindr", root, tmp_path / "results", "--data.split", "train",
                                 "--data.readers", "leave_one_out"))
    notes = results["data"]["notes"]
    assert notes["images_with_one_reader_skipped"] == 1 and notes["reads"] == 3 and notes["images"] == 1
    assert results["grounding"]["per_class"]["cardiomegaly"]["pairs"] == 3  # R2's read too: the others drew it


# ---------------------------------------------------------------------------------------------------------
# CheXlocalize's human benchmark (issue 49.2): an HB file of another split, the val split asked for it,
# an HB mask not at the image's size, a point outside the image, a point list that is no list of points.
# ---------------------------------------------------------------------------------------------------------

from test_chexlocalize_hb import TOOL as HB_TOOL  # noqa: E402


@pytest.fixture
def hb_release(tmp_path):
    root = tmp_path / "chexlocalize"
    HB_TOOL.write_release(root)
    return root


def _hb_run(root, results, capsys, *extra):
    return run_cli(run_args("human", "chexlocalize", root, results, "--data.human_benchmark", "true",
                            "--trainer.logger", "false", "--data.cache", "false", *extra, image_size=16), capsys)


def _rewrite(path, change):
    payload = json.loads(path.read_text())
    change(payload)
    path.write_text(json.dumps(payload))


@pytest.mark.parametrize("name", ["hb_segmentations_test.json", "hb_salient_pt_test.json"])
def test_a_human_benchmark_file_of_another_split_is_named(hb_release, tmp_path, capsys, name):
    """The val split's ids (patient64541...) in a test HB file: no image of the split."""
    path = hb_release / "CheXlocalize" / name
    _rewrite(path, lambda p: p.update({f"patient{64541 + i}_study1_view1_frontal": p.pop(cxr_id)
                                       for i, cxr_id in enumerate(list(p))}))
    code, err = _hb_run(hb_release, tmp_path / "results", capsys)
    assert code == 1 and str(path) in err and "CXRs are no image of the test split" in err, err
    assert "e.g. patient64541_study1_view1_frontal" in err and "must be the test split's" in err
    assert not (tmp_path / "results").exists() or not any((tmp_path / "results").iterdir())


def test_the_val_split_asked_for_its_human_benchmark_is_named(hb_release, tmp_path, capsys):
    code, err = _hb_run(hb_release, tmp_path / "results", capsys, "--data.split", "val")
    assert code == 1 and "--data.human_benchmark" in err and "the val split has none" in err, err
    assert "--data.split test" in err


def test_a_model_human_without_the_human_benchmark_is_named(hb_release, tmp_path, capsys):
    code, err = _hb_run(hb_release, tmp_path / "results", capsys, "--data.human_benchmark", "false")
    assert code == 1 and "has none" in err and "human-agreement.md" in err, err


def test_a_human_benchmark_mask_not_at_the_image_size_is_named(hb_release, tmp_path, capsys):
    path = hb_release / "CheXlocalize" / "hb_segmentations_test.json"
    cxr_id = HB_TOOL.CXR_IDS[1]
    _rewrite(path, lambda p: p[cxr_id].update({"Edema": HB_TOOL.encode(np.ones((5, 7), bool))}))
    code, err = _hb_run(hb_release, tmp_path / "results", capsys)
    assert code == 1 and f"{cxr_id}, 'Edema'" in err and "the mask is 5x7" in err and "24x20" in err, err


@pytest.mark.parametrize(("point", "message"), [
    ([20.0, 3.0], "point (x, y) = (20.0, 3.0) lies outside the 20x24"),  # x = width: one column past the edge
    ([-0.5, 3.0], "point (x, y) = (-0.5, 3.0) lies outside"),  # their int() would read column 0
    ([3.0], "expected a list of points [[x, y], ...]"),
    (["3", 4], "expected a list of points [[x, y], ...]"),
])
def test_a_bad_salient_point_is_named(hb_release, tmp_path, capsys, point, message):
    path = hb_release / "CheXlocalize" / "hb_salient_pt_test.json"
    cxr_id = HB_TOOL.CXR_IDS[1]
    _rewrite(path, lambda p: p.setdefault(cxr_id, {}).update({"Support Devices": [point]}))
    code, err = _hb_run(hb_release, tmp_path / "results", capsys)
    assert code == 1 and str(path) in err and cxr_id in err and message in err, err


def test_both_spellings_of_one_finding_in_the_human_benchmark_are_named(hb_release, tmp_path, capsys):
    path = hb_release / "CheXlocalize" / "hb_salient_pt_test.json"
    cxr_id = HB_TOOL.CXR_IDS[0]
    _rewrite(path, lambda p: p[cxr_id].update({"Airspace Opacity": [[1.0, 1.0]], "Lung Opacity": [[2.0, 2.0]]}))
    code, err = _hb_run(hb_release, tmp_path / "results", capsys)
    assert code == 1 and "a second point list for lung_opacity" in err, err


# -- issue 49.5: human reader sets in the analysis and the report ---------------------------------


@pytest.fixture(scope="module")
def human_runs(tmp_path_factory):
    """The centre prior and the phantom's second reader on 6 images, and the reader alone on 5
    other ones; each folder under its own ``results`` root, by name."""
    root = tmp_path_factory.mktemp("human_bad")
    phantom = ("--data.native_size", "48", "--data.second_reader", "true")
    for name, model, images in (("pair", "centre_prior", "6"), ("pair", "human", "6"), ("other", "human", "5")):
        main(quiet_run(model, "phantom", root / f"phantom{images}", root / name, *phantom,
                       "--data.num_images", images, image_size=16))
    return root


def _human_copy(human_runs, tmp_path, change=None, which="human-*"):
    """A copy of the pair's results, the folder matching ``which`` edited by ``change`` and resealed."""
    import shutil

    copy = tmp_path / "results"
    shutil.copytree(human_runs / "pair", copy)
    (folder,) = copy.glob(f"{which}__*")
    if change is not None:
        _edit_json(folder, change)
        reseal(folder)
    return copy, folder


def test_a_human_folder_on_other_images_than_the_models_is_named(human_runs, tmp_path, capsys):
    import shutil

    from xbench.analyze import main as analyze_main

    copy, folder = _human_copy(human_runs, tmp_path)
    shutil.rmtree(folder)
    (other,) = (human_runs / "other").iterdir()
    shutil.copytree(other, copy / other.name)
    code, err = run_command(analyze_main, [str(copy), "--out", str(tmp_path / "out"), "--replicates", "5"],
                            "xbench-analyze", capsys)
    assert_one_line(code, err, 1, f"the human reader's folder {copy / other.name} is on other images of phantom",
                    "only in", "run the models and --model human on the same split")


@pytest.mark.parametrize(("change", "named"), [
    (lambda p: {**p, "instrument": True}, "claims to be both a test instrument"),
    (lambda p: {k: v for k, v in p.items() if k != "reader_set"}, "'human' is true but 'reader_set'"),
    (lambda p: {**p, "human": "yes"}, "'human' is 'yes', not true or false"),
    (lambda p: {**p, "data": {**p["data"], "reads": 1}}, "'data.reads' is 1, not true or false"),
])
def test_a_folder_that_misstates_its_kind_is_named_by_the_report(human_runs, tmp_path, capsys, change, named):
    from xbench.report import main as report_main

    copy, folder = _human_copy(human_runs, tmp_path, change)
    code, err = run_command(report_main, [str(copy), "--out", str(tmp_path / "out"), "--no-analysis"],
                            "xbench-report", capsys)
    assert_one_line(code, err, 1, str(folder / "metrics.json"), named)
    assert left_behind(tmp_path / "out") == []


def test_a_folder_that_claims_reads_without_reads_ids_is_named(human_runs, tmp_path, capsys):
    from xbench.analyze import main as analyze_main

    copy, folder = _human_copy(human_runs, tmp_path, lambda p: {**p, "data": {**p["data"], "reads": True}},
                               which="centre_prior")
    code, err = run_command(analyze_main, [str(copy), "--out", str(tmp_path / "out"), "--replicates", "5"],
                            "xbench-analyze", capsys)
    assert_one_line(code, err, 1, str(folder / "metrics.json"), "data.reads is true", "are not reads' ids")


def test_model_human_on_a_dataset_without_a_second_reader_is_named(phantom_root, tmp_path, capsys):
    code, err = run_cli(quiet_run("human", "phantom", phantom_root, tmp_path / "results"), capsys)
    assert_one_line(code, err, 1, "--model human scores a second reader", "Phantom as configured has none")
    assert left_behind(tmp_path / "results") == []


def test_model_human_under_an_augmentation_is_named(phantom_root, tmp_path, capsys):
    """A reader's marks are drawn on the image as read: an augmentation would move only the reference."""
    code, err = run_cli(quiet_run("human", "phantom", phantom_root, tmp_path / "results", "--data.second_reader",
                                  "true", "--config", "lightning_configs/augment/rotate10.yaml"), capsys)
    assert_one_line(code, err, 1, "--model human draws the reader's marks", "cannot follow --data.augment")
    assert left_behind(tmp_path / "results") == []


# ---- issue 51: the gaze datasets (REFLACX, EGD-CXR) ----


def _reflacx(tmp_path, **options):
    from xbench.data.reflacx import REFLACX

    data = REFLACX(str(tmp_path / "reflacx"), str(tmp_path / "mimic"), image_size=16, num_workers=0, cache=False,
                   classes=["atelectasis", "cardiomegaly", "nodule_mass"], **options)
    return data


def _reflacx_release(tmp_path):
    from test_reflacx import write_release

    write_release(tmp_path / "reflacx", tmp_path / "mimic")
    return tmp_path / "reflacx" / "main_data"


def _edit_csv(path, edit):
    import csv

    with open(path, newline="") as handle:
        rows = list(csv.reader(handle))
    edit(rows)
    with open(path, "w", newline="") as handle:
        csv.writer(handle).writerows(rows)


def test_a_reflacx_reading_whose_image_is_missing_is_named_with_its_line_and_the_fix(tmp_path):
    _reflacx_release(tmp_path)
    missing = next((tmp_path / "mimic").rglob("img-d.jpg"))
    missing.unlink()
    with pytest.raises(FileNotFoundError) as error:
        _reflacx(tmp_path).samples
    message = str(error.value)
    assert "metadata_phase_3.csv, line 2" in message and "P300R000009" in message and str(missing) in message
    assert "--data.images_root" in message


def test_reflacx_fixations_outside_the_image_are_left_out_and_counted(tmp_path):
    main = _reflacx_release(tmp_path)
    _edit_csv(main / "P300R000009" / "fixations.csv", lambda rows: rows[1].__setitem__(2, "70"))  # x beyond 56
    data = _reflacx(tmp_path)
    data.samples
    assert data.notes["fixations_outside_image"] == 1
    assert len(data.fixations(next(r for r in data.readings() if r.id == "P300R000009"))) == 11


def test_a_reflacx_fixation_with_a_negative_duration_is_named(tmp_path):
    main = _reflacx_release(tmp_path)
    _edit_csv(main / "P300R000009" / "fixations.csv", lambda rows: rows[2].__setitem__(1, "-1.0"))
    with pytest.raises(ValueError, match=r"fixations.csv, line 3: the fixation ends .* negative duration, in "
                                         r"reading P300R000009"):
        _reflacx(tmp_path).samples


def test_a_reflacx_reading_marked_discarded_is_counted_and_gives_no_gaze(tmp_path):
    _reflacx_release(tmp_path)
    data = _reflacx(tmp_path)
    data.samples
    assert data.notes["readings_discarded"] == 1  # img-c's second reading, which has no fixations file
    assert len(data.gaze_targets["img-c"].tied["atelectasis"].readings) == 1


def test_a_reflacx_discarded_flag_that_is_not_a_boolean_is_named(tmp_path):
    from test_reflacx import write_release

    write_release(tmp_path / "reflacx", tmp_path / "mimic", discarded_label="no")
    with pytest.raises(ValueError, match=r"metadata_phase_1.csv, line 2: eye_tracking_data_discarded is 'no'"):
        _reflacx(tmp_path).samples


def test_a_reflacx_transcript_without_timestamps_is_named_for_the_finding_gaze(tmp_path):
    main = _reflacx_release(tmp_path)
    _edit_csv(main / "P300R000009" / "timestamps_transcription.csv", lambda rows: rows[3].__setitem__(1, ""))
    _reflacx(tmp_path).samples  # the whole reading's gaze does not need the transcript
    with pytest.raises(ValueError, match=r"timestamps_transcription.csv, line 4: the word .* of reading P300R000009 "
                                         r"has no timestamps.*--data.gaze reading"):
        _reflacx(tmp_path, gaze="finding").samples


def test_an_egd_cxr_transcript_without_timestamps_is_named_and_off_image_gaze_is_counted(tmp_path):
    import json

    from test_egd_cxr import IMAGES, write_release

    from xbench.data.egd_cxr import EGDCXR

    write_release(tmp_path / "egd", tmp_path / "mimic")
    options = dict(image_size=16, num_workers=0, cache=False, split="all")
    data = EGDCXR(str(tmp_path / "egd"), str(tmp_path / "mimic"), **options)
    data.samples
    assert data.notes["fixations_outside_image"] == len(IMAGES)
    transcript = tmp_path / "egd" / "audio_segmentation_transcripts" / "dcm-0" / "transcript.json"
    content = json.loads(transcript.read_text())
    del content["time_stamped_text"][1]["begin_time"]
    transcript.write_text(json.dumps(content))
    with pytest.raises(ValueError, match=r"dcm-0/transcript.json, time_stamped_text\[1\]: the phrase has no "
                                         r"begin_time/end_time"):
        EGDCXR(str(tmp_path / "egd"), str(tmp_path / "mimic"), gaze="finding", **options).samples


def test_an_egd_cxr_image_without_fixations_is_kept_without_gaze_and_counted(tmp_path):
    from test_egd_cxr import write_release

    from xbench.data.egd_cxr import EGDCXR

    write_release(tmp_path / "egd", tmp_path / "mimic")
    _edit_csv(tmp_path / "egd" / "fixations.csv", lambda rows: rows.__setitem__(slice(None), [
        row for row in rows if row[2] != "dcm-3"]))
    data = EGDCXR(str(tmp_path / "egd"), str(tmp_path / "mimic"), image_size=16, num_workers=0, cache=False, split="all")
    data.setup("test")
    assert data.notes["images_without_fixations"] == 1
    row = [s.image_id for s in data.samples].index("dcm-3")
    record = data.test_set[row]
    assert not record["has_gaze"].any() and record["gaze"].abs().sum() == 0


def test_a_reflacx_image_of_another_shape_than_its_fixations_grid_is_named(tmp_path):
    from PIL import Image

    _reflacx_release(tmp_path)
    Image.new("L", (30, 30), 0).save(next((tmp_path / "mimic").rglob("img-d.jpg")))
    data = _reflacx(tmp_path)
    data.setup("test")
    row = [s.image_id for s in data.samples].index("img-d")
    with pytest.raises(ValueError, match=r"metadata_phase_3.csv, line 2: image img-d is 30 x 30 .* fixations are on a "
                                         r"56 x 40 grid.*--data.images_root"):
        data.test_set[row]


# Issue 51.3: the gaze metrics, their records and the centre-bias baseline (h51-metrics)
# =============================================================================================

import gzip as _gzip  # noqa: E402

import pandas as _pd  # noqa: E402
import torch as _torch  # noqa: E402

from xbench.analysis.pipeline import analyze as _analyze  # noqa: E402
from xbench.metrics.gaze import GazeMetrics  # noqa: E402


@pytest.fixture(scope="module")
def gaze_folder(phantom_root, tmp_path_factory):
    out = tmp_path_factory.mktemp("gaze-bad")
    main(run_args("random", "phantom", phantom_root, out, "--data.gaze", "true", "--trainer.logger", "false",
                  image_size=32))
    return only_folder(out)


def _gaze_copy(folder, tmp_path):
    copy = tmp_path / folder.name
    shutil.copytree(folder, copy)
    return copy


def test_a_gaze_value_outside_its_range_is_named(gaze_folder, tmp_path):
    folder = _gaze_copy(gaze_folder, tmp_path)
    table = _pd.read_csv(folder / "gaze.csv.gz")
    table.loc[1, "sim"] = 1.5  # SIM is a histogram intersection: at most 1
    with _gzip.open(folder / "gaze.csv.gz", "wt") as handle:
        table.to_csv(handle, index=False)
    with pytest.raises(ValueError, match=r"gaze\.csv\.gz, data row 3, column sim: 1\.5 lies outside its range"):
        _analyze([reseal(folder)])


def test_a_gaze_estimate_edited_in_metrics_json_is_named(gaze_folder, tmp_path):
    folder = _gaze_copy(gaze_folder, tmp_path)
    payload = json.loads((folder / "metrics.json").read_text())
    payload["gaze"]["macro"]["nss"] += 0.5
    (folder / "metrics.json").write_text(json.dumps(payload))
    with pytest.raises(ValueError, match=r"gaze\.macro\.nss is .* but the folder's records \(gaze\.csv\.gz\)"):
        _analyze([reseal(folder)])


def test_gaze_records_without_their_section_are_named(gaze_folder, tmp_path):
    folder = _gaze_copy(gaze_folder, tmp_path)
    payload = json.loads((folder / "metrics.json").read_text())
    del payload["gaze"]
    (folder / "metrics.json").write_text(json.dumps(payload))
    with pytest.raises(ValueError, match=r"gaze\.csv\.gz is present, but metrics\.json has no gaze section"):
        _analyze([reseal(folder)])


def test_gaze_pairs_that_do_not_match_their_counts_are_named(gaze_folder, tmp_path):
    folder = _gaze_copy(gaze_folder, tmp_path)
    table = _pd.read_csv(folder / "gaze.csv.gz")
    with _gzip.open(folder / "gaze.csv.gz", "wt") as handle:
        table.iloc[1:].to_csv(handle, index=False)
    with pytest.raises(ValueError, match=r"pairs per class, but metrics\.json's gaze section counts"):
        _analyze([reseal(folder)])


def test_the_centre_bias_model_on_a_dataset_without_gaze_is_named(phantom_root, tmp_path):
    with pytest.raises(ValueError, match=r"--model gaze_centre_bias .* has no gaze: choose a gaze dataset"):
        main(run_args("gaze_centre_bias", "phantom", phantom_root, tmp_path, "--trainer.logger", "false",
                      image_size=32))


@pytest.mark.parametrize("baseline", [_torch.full((4, 4), -1.0), _torch.full((4, 4), float("nan")), _torch.ones(4)])
def test_a_centre_bias_that_is_no_density_is_refused(baseline):
    with pytest.raises(ValueError, match="centre-bias baseline must be a finite, non-negative"):
        GazeMetrics(2, baseline)


def test_the_phantoms_gaze_refuses_an_augmentation(phantom_root):
    with pytest.raises(ValueError, match=r"--data.gaze .* cannot follow --data.augment"):
        from xbench.data.phantom import Phantom

        Phantom(root=str(phantom_root), gaze=True,
                augment=[{"class_path": "albumentations.HorizontalFlip", "init_args": {"p": 1.0}}])


def test_gaze_batches_without_a_centre_bias_are_named(phantom_root):
    import lightning as L

    from xbench.data.phantom import Phantom
    from xbench.models.baselines import RandomSaliency

    class WithoutCentreBias(Phantom):
        def gaze_baseline(self):
            return None

    data = WithoutCentreBias(root=str(phantom_root), gaze=True, image_size=32, num_workers=0, cache=False)
    trainer = L.Trainer(logger=False, enable_progress_bar=False, use_distributed_sampler=False,
                        enable_model_summary=False)
    with pytest.raises(RuntimeError, match=r"WithoutCentreBias's batches carry gaze, but its gaze_baseline\(\) gave "
                                           r"no centre bias"):
        trainer.test(RandomSaliency(), datamodule=data, verbose=False)


# == Issue 49.4 / 49.6: PadChest-GR's hostile cases ====================================================

def _padchest_gr(tmp_path, findings, **kwargs):
    from conftest import write_padchest_gr

    studies = [{"StudyID": "s-ok", "ImageID": "ok.png", "findings": [
        {"sentence_en": "Cardiomegaly.", "labels": ["cardiomegaly"], "abnormal": True,
         "boxes": [[0.25, 0.25, 0.75, 0.75]], "extra_boxes": []}]},
               {"StudyID": "s-bad", "ImageID": "bad.png", "findings": findings}]
    return write_padchest_gr(tmp_path / "padchest-gr", studies, size=(32, 24), **kwargs)


@pytest.mark.parametrize(("field", "box"), [("boxes", [0.1, 0.2, 1.2, 0.5]), ("extra_boxes", [-0.05, 0.2, 0.4, 0.5]),
                                            ("boxes", [20, 30, 60, 80])])
def test_a_padchest_gr_box_outside_the_unit_square_stops_the_run_naming_study_and_sentence(tmp_path, capsys, field, box):
    """Corners are fractions of the image's size: one outside [0, 1] (pixels, a wrong file) is named."""
    sentence = {"sentence_en": "Nodule.", "labels": ["nodule"], "abnormal": True, "boxes": [[0.1, 0.1, 0.2, 0.2]],
                "extra_boxes": [], field: [box]}
    root = _padchest_gr(tmp_path, [sentence])
    code, err = run_cli(quiet_run("centre_prior", "padchest_gr", root, tmp_path / "results"), capsys)
    assert_one_line(code, err, 1, f"{root / 'grounded_reports_20240819.json'}, entry 1 (study s-bad), finding 0, "
                    f"{field}: box {box}", "reaches outside [0, 1]", "fractions of the image's width and height")
    assert left_behind(tmp_path / "results") == []


def test_a_padchest_gr_study_without_its_image_stops_the_run_naming_study_and_path(tmp_path, capsys):
    sentence = {"sentence_en": "No effusion.", "labels": ["pleural effusion"], "abnormal": False, "boxes": [],
                "extra_boxes": []}
    root = _padchest_gr(tmp_path, [sentence], missing_images=("bad.png",))
    code, err = run_cli(quiet_run("centre_prior", "padchest_gr", root, tmp_path / "results"), capsys)
    assert_one_line(code, err, 1, "entry 1 (study s-bad): its image bad.png is not at",
                    str(root / "Padchest_GR_files" / "bad.png"), "--data.images")
    assert left_behind(tmp_path / "results") == []


def test_a_padchest_gr_sentence_with_boxes_but_abnormal_false_is_a_counted_skip(tmp_path):
    """Neither stated (abnormal false) nor denied (it has boxes): left out of grounding and of the
    denied sentences, counted, and named in a warning; the study's other sentences stay."""
    from xbench.data.padchest_gr import PadChestGR

    root = _padchest_gr(tmp_path, [
        {"sentence_en": "No nodule.", "labels": ["nodule"], "abnormal": False, "boxes": [[0.1, 0.1, 0.3, 0.3]],
         "extra_boxes": []},
        {"sentence_en": "No effusion.", "labels": ["pleural effusion"], "abnormal": False, "boxes": [],
         "extra_boxes": [[0.5, 0.5, 0.7, 0.7]]},
        {"sentence_en": "Scoliosis.", "labels": ["scoliosis"], "abnormal": True, "boxes": [[0.4, 0.0, 0.6, 1.0]],
         "extra_boxes": []},
    ])
    dm = PadChestGR(root=str(root), cache=False, num_workers=0)
    with pytest.warns(UserWarning, match=r"2 sentences .* have boxes but abnormal: false \(e\.g\. .*entry 1 "
                                         r"\(study s-bad\), finding 0; .*finding 1\)"):
        samples = dm.samples
    bad = samples[1]
    assert [(q.text, q.asserted) for q in bad.queries] == [("Scoliosis.", True)]
    assert set(bad.regions) == {"scoliosis"} and bad.labels["nodule"] == 0
    assert dm.notes["negative_sentences_with_boxes"] == 2 and dm.notes["negative_sentences"] == 0


@pytest.mark.parametrize(("finding", "message"), [
    ({"sentence_en": "Nodule.", "labels": ["nodule"], "abnormal": "yes", "boxes": []}, "abnormal must be true or false"),
    ({"sentence_en": "Nodule.", "labels": "nodule", "abnormal": True, "boxes": []}, "labels must be a list of strings"),
    ({"sentence_en": "Nodule.", "labels": ["nodule"], "abnormal": True, "boxes": [[0.1, 0.1, 0.1, 0.3]]},
     "needs x2 > x1 and y2 > y1"),
    ({"sentence_en": "Nodule.", "labels": ["nodule"], "abnormal": True, "boxes": [[0.1, float("nan"), 0.2, 0.3]]},
     "is not [x1, y1, x2, y2] of finite numbers"),
    ({"sentence_en": " ", "labels": ["nodule"], "abnormal": False, "boxes": []}, "sentence_en is empty"),
])
def test_a_padchest_gr_sentence_of_the_wrong_shape_is_named(tmp_path, finding, message):
    from xbench.data.padchest_gr import PadChestGR

    root = _padchest_gr(tmp_path, [finding])
    with pytest.raises(ValueError, match=re.escape(message)) as error:
        _ = PadChestGR(root=str(root), cache=False).samples
    assert "entry 1 (study s-bad), finding 0" in str(error.value), str(error.value)


def test_padchest_gr_refuses_a_split_it_lacks_a_study_outside_the_master_table_and_a_human_run_without_both(
        tmp_path, capsys):
    from xbench.data.padchest_gr import PadChestGR

    root = _padchest_gr(tmp_path, [], splits={"s-ok": "train", "s-bad": "train"})
    with pytest.raises(ValueError, match=r"has no study of split 'test' \(its splits: \['train'\]\)"):
        _ = PadChestGR(root=str(root)).samples
    table = root / "master_table.csv"
    table.write_text("\n".join(line for line in table.read_text().splitlines() if "s-bad" not in line) + "\n")
    with pytest.raises(ValueError, match=r"entry 1 \(study s-bad\): the study is not in .*master_table.csv"):
        _ = PadChestGR(root=str(root), split="all").samples
    root = _padchest_gr(tmp_path / "again", [])
    code, err = run_cli(quiet_run("human", "padchest_gr", root, tmp_path / "results"), capsys)
    assert_one_line(code, err, 1, "--model human scores a second reader", "PadChestGR")


# ---------------------------------------------------------------------------------------------------
# cheXlocalize's percentage decrease in the report (issue 49, item 2 and 5): the native-size rows of
# chexlocalize_pairs.csv.gz, read back with range checks; a model without them is named, not dropped.
# ---------------------------------------------------------------------------------------------------

import gzip  # noqa: E402

import pandas as _pd  # noqa: E402

from test_chexlocalize_hb import TASKS as _HB_TASKS, TOOL as _HB_TOOL  # noqa: E402
from xbench.findings import finding_key as _finding_key  # noqa: E402

_HB_CLASSES = "[" + ",".join(_finding_key("chexlocalize", task) for task in _HB_TASKS) + "]"


@pytest.fixture(scope="module")
def hb_runs(tmp_path_factory):
    """The human benchmark's run and a saved-map run with cheXlocalize's protocol, on release files."""
    root = tmp_path_factory.mktemp("hb_bad")
    _HB_TOOL.write_release(root)
    for model, extra in (("human", ("--data.human_benchmark", "true")),
                         ("precomputed_chexlocalize", ("--model.path", str(root / "model" / "maps"),
                                                       "--model.native_protocol", "true"))):
        main(quiet_run(model, "chexlocalize", root, root / "results", "--data.classes", _HB_CLASSES,
                       "--data.cache", "false", *extra))
    return root / "results"


def _edit_native_rows(hb_runs, tmp_path, edit, seal=True):
    copy = tmp_path / "results"
    shutil.copytree(hb_runs, copy)
    (folder,) = [p for p in copy.iterdir() if p.name.startswith("precomputedsaliency__")]
    path = folder / "chexlocalize_pairs.csv.gz"
    with gzip.open(path, "rt") as handle:
        rows = _pd.read_csv(handle)
    edit(rows).to_csv(path, index=False, compression="gzip")
    if seal:
        reseal(folder)
    return copy, path


def _set(column, value, row=0):
    def edit(rows):
        rows[column] = rows[column].astype(object)
        rows.loc[row, column] = value
        return rows
    return edit


@pytest.mark.parametrize(("edit", "named"), [
    (_set("chexlocalize_hit_rate", 0.5), "chexlocalize_hit_rate is not a value of cheXlocalize's protocol"),
    (_set("chexlocalize_iou_otsu", 1.5), "chexlocalize_iou_otsu is not a value of cheXlocalize's protocol"),
    (_set("xbench_iou@0.5", float("nan")), "xbench_iou@0.5 is not a value of cheXlocalize's protocol"),
    (_set("chexlocalize_iou_fixed", "many"), "chexlocalize_iou_fixed is not a value of cheXlocalize's protocol"),
    (_set("image_id", "patient1_study1_view1_frontal"), "class or image_id not among the run's"),
    (_set("class", "pneumonia"), "class or image_id not among the run's"),
    (lambda rows: _pd.concat([rows, rows.iloc[:1]], ignore_index=True), "a second row for the same (image, class)"),
    (lambda rows: rows.drop(columns="chexlocalize_hit_rate"), "columns missing: chexlocalize_hit_rate"),
])
def test_native_rows_out_of_range_are_named_by_the_analysis(hb_runs, tmp_path, capsys, edit, named):
    from xbench.analyze import main as analyze_main

    copy, path = _edit_native_rows(hb_runs, tmp_path, edit)
    code, err = run_command(analyze_main, [str(copy), "--out", str(tmp_path / "out"), "--replicates", "5"],
                            "xbench-analyze", capsys)
    assert_one_line(code, err, 1, str(path), named)


def test_native_rows_edited_behind_the_manifest_are_named(hb_runs, tmp_path, capsys):
    from xbench.report import main as report_main

    copy, path = _edit_native_rows(hb_runs, tmp_path, _set("chexlocalize_hit_rate", 0.0, row=1), seal=False)
    code, err = run_command(report_main, [str(copy), "--out", str(tmp_path / "out"), "--replicates", "5"],
                            "xbench-report", capsys)
    assert_one_line(code, err, 1, str(path.parent), "chexlocalize_pairs.csv.gz")
    assert left_behind(tmp_path / "out") == []


def test_a_model_without_native_rows_is_named_not_dropped(hb_runs, tmp_path):
    """A saved-map run without --model.native_protocol beside the human benchmark: no row of their
    table, and its name in the report's line and the analysis' not-comparable table."""
    from xbench.report import main as report_main

    copy = tmp_path / "results"
    shutil.copytree(hb_runs, copy)
    (folder,) = [p for p in copy.iterdir() if p.name.startswith("precomputedsaliency__")]
    (folder / "chexlocalize_pairs.csv.gz").unlink()
    reseal(folder)
    report_main([str(copy), "--out", str(tmp_path / "out"), "--replicates", "5"])
    assert _pd.read_csv(tmp_path / "out" / "analysis" / "chexlocalize_decrease.csv").empty
    apart = _pd.read_csv(tmp_path / "out" / "analysis" / "chexlocalize_not_comparable.csv")
    assert list(apart.model) == ["precomputedsaliency"]
    assert ("Not comparable by cheXlocalize's protocol on CheXlocalize (no native-size rows; saved maps run with "
            "--model.native_protocol true have them): precomputedsaliency.") in (tmp_path / "out" / "report.md").read_text()
