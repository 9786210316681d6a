"""Golden NCC and shuffled NCC from etsaliencymaps' own functions, for ``xbench.metrics.gaze``.

Development only; the authors' repository (``ricbl/etsaliencymaps``, as fetched) is read from
``--authors-repo``, never copied. Their ``src/compare_heatmaps.py`` parses arguments and makes
folders when imported, so only its two function definitions, ``normalised_corr`` and
``shuffled_normalised_corr``, are taken from the file's syntax tree and run (NumPy, as their
module imports it), on seeded cases: random densities and maps, a constant map, a map equal to the
gaze, a centre bias equal to the gaze, ties.

    python tools/parity/etsaliencymaps_ncc.py --authors-repo /tmp/etsaliencymaps \\
        --out tests/golden/etsaliencymaps_ncc.npz

The file holds, per case ``i``: ``<i>_gaze``, ``<i>_map``, ``<i>_baseline`` (float64 [S, S]),
``<i>_ncc`` and ``<i>_sncc`` (their values, NaN where their code divides by a zero deviation), and
``meta`` (JSON: the commit, the cases, NumPy's version).
"""

from __future__ import annotations

import argparse
import ast
import json
import subprocess
import warnings
from pathlib import Path

import numpy as np

FUNCTIONS = ("normalised_corr", "shuffled_normalised_corr")
SIDE = 24


def their_functions(repo: Path) -> dict:
    """The two functions of their ``compare_heatmaps.py``, executed from its own source."""
    source = (repo / "src" / "compare_heatmaps.py").read_text()
    tree = ast.parse(source)
    chosen = [node for node in tree.body if isinstance(node, ast.FunctionDef) and node.name in FUNCTIONS]
    if len(chosen) != len(FUNCTIONS):
        raise SystemExit(f"{repo}: compare_heatmaps.py lacks one of {FUNCTIONS}")
    namespace = {"np": np}
    exec(compile(ast.Module(body=chosen, type_ignores=[]), "compare_heatmaps.py", "exec"), namespace)  # noqa: S102
    return {name: namespace[name] for name in FUNCTIONS}


def _density(x: np.ndarray) -> np.ndarray:
    return x / x.sum()


def cases(rng: np.random.Generator) -> list[tuple[str, np.ndarray, np.ndarray, np.ndarray]]:
    """(name, gaze density, model map, centre bias) of every case."""
    axis = np.arange(SIDE) + 0.5
    yy, xx = np.meshgrid(axis, axis, indexing="ij")
    centre = _density(np.exp(-((yy - SIDE / 2) ** 2 + (xx - SIDE / 2) ** 2) / (2 * (SIDE / 4) ** 2)))
    out = []
    for k in range(4):
        gaze = _density(rng.random((SIDE, SIDE)) ** 3)
        out.append((f"random{k}", gaze, rng.random((SIDE, SIDE)), centre))
    gaze = _density(rng.random((SIDE, SIDE)))
    out.append(("constant_map", gaze, np.zeros((SIDE, SIDE)), centre))
    out.append(("map_is_gaze", gaze, gaze / gaze.max(), centre))
    out.append(("baseline_is_gaze", gaze, rng.random((SIDE, SIDE)), gaze))
    out.append(("ties", gaze, np.round(rng.random((SIDE, SIDE)) * 3) / 3, centre))
    return out


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--authors-repo", type=Path, required=True)
    parser.add_argument("--out", type=Path, required=True)
    options = parser.parse_args()
    theirs = their_functions(options.authors_repo)
    arrays, names = {}, []
    for i, (name, gaze, saliency, baseline) in enumerate(cases(np.random.default_rng(51))):
        with warnings.catch_warnings():
            warnings.simplefilter("ignore", RuntimeWarning)  # their 0 / 0 on a constant map: NaN
            # their call order (get_average_et_scores): metric_fn(gaze, model map, centre bias)
            arrays[f"{i}_ncc"] = np.float64(theirs["normalised_corr"](gaze, saliency, None))
            arrays[f"{i}_sncc"] = np.float64(theirs["shuffled_normalised_corr"](gaze, saliency, baseline))
        arrays.update({f"{i}_gaze": gaze, f"{i}_map": saliency, f"{i}_baseline": baseline})
        names.append(name)
    commit = subprocess.run(["git", "-C", str(options.authors_repo), "rev-parse", "HEAD"], capture_output=True,
                            text=True).stdout.strip() or "unknown"
    meta = {"repository": "ricbl/etsaliencymaps", "commit": commit, "file": "src/compare_heatmaps.py",
            "functions": list(FUNCTIONS), "cases": names, "numpy": np.__version__}
    np.savez_compressed(options.out, meta=np.array(json.dumps(meta)), **arrays)
    print(f"wrote {options.out}: {len(names)} cases from {meta['repository']}@{commit[:12]}")


if __name__ == "__main__":
    main()
