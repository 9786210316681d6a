"""Golden REFLACX gaze heatmaps from the authors' own code, for ``tests/test_reflacx.py``.

Development only; nothing of their code is copied into XBench. Their functions are compiled from
their repositories as fetched (their modules process the whole dataset when imported, so only the
function definitions are taken from the source and run):

- ricbl/eyetracking ``examples_and_paper_numbers/generate_heatmaps.py``: ``get_gaussian`` and
  ``create_heatmap(fixations, size_x, size_y)``, the whole reading's heatmap;
- ricbl/eye-tracking-localization ``src/find_fixations_all_sentences.py``: ``create_heatmap(fixations,
  size_x, size_y, sentence_start, sentence_end, bboxes, labels, image_name)`` (with the helpers it
  calls), a sentence's window, normalised by its maximum (the test compares after normalising to sum 1).

They run on seeded fixations of one reading of a square ``SIDE x SIDE`` image (so the metric
frame at ``image_size = SIDE`` puts its pixel centres on the native pixels) and on the windows of
three dictated sentences by their default ``1.5s_startofsentence_lastmention``: from 1.5 s before the
sentence's first word starts (not before the previous sentence's first word; 0 for the first) to
the start of the word of the mention (``MENTIONED``: one word per sentence, where their labeller's
mention ends), the bounds their ``generate_et_heatmaps_for_one_image`` hands ``create_heatmap``.

    python tools/parity/reflacx_heatmaps.py --eyetracking /work/.mirror/ricbl+eyetracking/repo \\
        --localization /work/.mirror/ricbl+eye-tracking-localization/repo --out tests/golden/reflacx_heatmaps.npz

The file holds ``rows`` (the fixations.csv rows, float64 [F, 17], its columns in ``meta``),
``words`` (the transcript, in ``meta``), ``windows`` [3, 2], ``whole`` [SIDE, SIDE] and
``windowed`` [3, SIDE, SIDE] (their output, float32) and ``meta`` (JSON: commits, files, versions).
"""

from __future__ import annotations

import argparse
import ast
import json
import math
import subprocess
import tempfile
from pathlib import Path

import numpy as np
import pandas as pd
import scipy
from scipy.stats import multivariate_normal

SIDE = 48
SEED = 51
COLUMNS = ["timestamp_start_fixation", "timestamp_end_fixation", "x_position", "y_position", "pupil_area_normalized",
           "angular_resolution_x_pixels_per_degree", "angular_resolution_y_pixels_per_degree", "window_width",
           "window_level", "xmin_shown_from_image", "ymin_shown_from_image", "xmax_shown_from_image",
           "ymax_shown_from_image", "xmin_in_screen_coordinates", "ymin_in_screen_coordinates",
           "xmax_in_screen_coordinates", "ymax_in_screen_coordinates"]
SENTENCES = (("atelectasis at the left base", 3.0, 6.0), ("moderate cardiomegaly is present", 9.0, 11.0),
             ("a nodule in the right lung", 13.5, 17.0))
#: The word of each sentence that ends its mention.
MENTIONED = (0, 1, 1)
BEFORE_S = 1.5


def their_functions(path: Path, names: tuple[str, ...]) -> dict:
    """The named top-level functions of the authors' file, compiled from its source."""
    tree = ast.parse(path.read_text())
    module = ast.Module(body=[node for node in tree.body if isinstance(node, ast.FunctionDef) and node.name in names],
                        type_ignores=[])
    namespace = {"np": np, "pd": pd, "math": math, "multivariate_normal": multivariate_normal}
    exec(compile(module, str(path), "exec"), namespace)
    return namespace


def inputs() -> tuple[np.ndarray, list[list]]:
    rng = np.random.default_rng(SEED)
    rows, t = [], 0.0
    for _ in range(25):
        duration = round(float(rng.uniform(0.1, 1.2)), 3)
        shown = [0, 0, SIDE, SIDE] if rng.random() < 0.5 else [int(rng.integers(0, 8)), int(rng.integers(0, 8)),
                                                             int(rng.integers(36, SIDE + 1)), int(rng.integers(36, SIDE + 1))]
        rows.append([round(t, 3), round(t + duration, 3), int(rng.integers(0, SIDE)), int(rng.integers(0, SIDE)), 0.5,
                     int(rng.integers(3, 9)), int(rng.integers(3, 9)), 1.0, 0.5, *shown, 0, 0, 1920, 1080])
        t = round(t + duration + float(rng.uniform(0.05, 0.4)), 3)
    words = []
    for text, start, end in SENTENCES:
        tokens = text.split()
        step = (end - start) / len(tokens)
        words += [[word, round(start + i * step, 3), round(start + (i + 1) * step - 0.05, 3)] for i, word in enumerate(tokens)]
        words.append([".", round(end, 3), round(end + 0.1, 3)])
    return np.array(rows, dtype=np.float64), words


def windows_of(words: list[list]) -> list[tuple[float, float]]:
    """Each sentence's (start, end) bounds by the authors' default method."""
    bounds, first, previous_first, new, sentence, position = [], 0.0, 0.0, True, 0, 0
    mention = None
    for word, start, _ in words:
        if new:
            previous_first, first, new, position = first, start, False, 0
        if word == ".":
            bounds.append((max(first - BEFORE_S, previous_first), mention))
            new, sentence = True, sentence + 1
            continue
        if position == MENTIONED[sentence]:
            mention = start
        position += 1
    return bounds


def commit(repo: Path) -> str:
    return subprocess.run(["git", "-C", str(repo), "rev-parse", "HEAD"], capture_output=True, text=True).stdout.strip()


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--eyetracking", type=Path, required=True, help="ricbl/eyetracking, as fetched")
    parser.add_argument("--localization", type=Path, required=True, help="ricbl/eye-tracking-localization, as fetched")
    parser.add_argument("--out", type=Path, required=True)
    args = parser.parse_args(argv)
    files = {"whole": args.eyetracking / "examples_and_paper_numbers" / "generate_heatmaps.py",
             "window": args.localization / "src" / "find_fixations_all_sentences.py"}
    for name, path in files.items():
        if not path.is_file():  # a mirror is a bare git folder: check the file out into a temporary folder
            repo = args.eyetracking if name == "whole" else args.localization
            relative = path.relative_to(repo)
            source = subprocess.run(["git", "-C", str(repo), "show", f"HEAD:{relative}"], capture_output=True,
                                    text=True, check=True).stdout
            files[name] = Path(tempfile.mkdtemp()) / relative.name
            files[name].write_text(source)
    whole_fn = their_functions(files["whole"], ("get_gaussian", "create_heatmap"))["create_heatmap"]
    window_fn = their_functions(files["window"], ("get_gaussian", "is_inside_ellipse", "converted_distance_to_screen",
                                                  "create_heatmap"))["create_heatmap"]
    no_ellipses = pd.DataFrame(columns=["xmin", "ymin", "xmax", "ymax", "certainty", "Atelectasis"], dtype=float)
    rows, words = inputs()
    table = pd.DataFrame(rows, columns=COLUMNS)
    windows = windows_of(words)
    whole = whole_fn(table, SIDE, SIDE)
    windowed = np.stack([window_fn(table, SIDE, SIDE, start, end, no_ellipses, ["Atelectasis"], "")[0]
                         for start, end in windows])
    meta = {"columns": COLUMNS, "words": words, "side": SIDE, "seed": SEED,
            "eyetracking": {"commit": commit(args.eyetracking), "file": "examples_and_paper_numbers/generate_heatmaps.py"},
            "localization": {"commit": commit(args.localization), "file": "src/find_fixations_all_sentences.py"},
            "versions": {"numpy": np.__version__, "scipy": scipy.__version__, "pandas": pd.__version__}}
    np.savez(args.out, rows=rows, windows=np.array(windows), whole=whole.astype(np.float32),
             windowed=windowed.astype(np.float32), meta=np.array(json.dumps(meta)))
    print(f"wrote {args.out}: {len(rows)} fixations, windows {windows}")


if __name__ == "__main__":
    main()
