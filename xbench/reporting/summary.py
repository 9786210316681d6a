"""One run's summary as a person reads it: the tables (grounding, recognition; a phrase dataset's
query grounding) and their notes, printed by ``xbench.test`` and written as ``summary.md``."""

from __future__ import annotations

from pathlib import Path

from rich.console import Console

from xbench.console import counted, print_table
from xbench.metrics.names import metric, run_keys
from xbench.results.names import finding_display
from xbench.reporting.render import markdown_grid

#: The console summary's and summary.md's columns.
SUMMARY_GROUNDING = ("pointing_game", "dice@0.5", "dice@best", "dice@best_tau", "iou@0.5", "iou@best", "iou@best_tau",
                     "cnr")
SUMMARY_RECOGNITION = ("auroc", "auprc", "f1@0.5", "accuracy@0.5", "max_f1")
#: The checks' tables (``xbench.checks``), in a run that asked for them: section -> (title, columns).
SUMMARY_CHECKS = {
    "faithfulness": ("Faithfulness on {images} (logit of the class)",
                     ("deletion_auc", "insertion_auc", "road_morf", "road_lerf", "road")),
    "sanity": ("Sanity on {images}: similarity to the original map once every layer group is randomised",
               ("spearman", "spearman_abs", "ssim")),
    "robustness": ("Robustness on {images}: the map under input noise",
                   ("max_sensitivity", "local_lipschitz")),
    "localisation": ("Localisation of the map in the region, graded pairs of {images} (percent)",
                     ("relevance_mass", "relevance_rank", "top_k_intersection", "pixel_auc")),
    "complexity": ("Complexity of the map, graded pairs of {images}", ("sparseness", "complexity")),
    "randomisation": ("Random logit, graded pairs of {images}: SSIM with another class's map",
                      ("random_logit",)),
    "gaze": ("Gaze on {images}: the map against the radiologist's gaze", run_keys("gaze", "per_class")),
}


def _text(key: str, value) -> str:
    """A value as the summary prints it: percent with one decimal, a threshold with two, a count."""
    if value is None:
        return "–"
    unit = metric(key).unit
    return f"{100 * value:.1f}" if unit == "percent" else f"{value:.2f}" if unit in ("threshold", "ratio", "logit") \
        else str(value)


def _summary_table(results: dict, section: dict, counts: tuple[str, ...], shown: tuple[str, ...],
                   summed: bool) -> list[list[str]]:
    """One row per class (display name, counts, values), then the macro mean (counts summed or blank)."""
    per_class, macro = section["per_class"], section["macro"]
    rows = [[finding_display(results, key), *(_text(n, per_class[key][n]) for n in counts + shown)]
            for key in results["classes"]]
    totals = [_text(n, sum(v[n] for v in per_class.values())) if summed else "" for n in counts]
    return rows + [["Macro mean", *totals, *(_text(n, macro[n]) if n in macro else "" for n in shown)]]


def summary_tables(results: dict) -> list[tuple[str, tuple[str, ...], list[list[str]]]]:
    """The run's tables (grounding, recognition; a phrase dataset's query grounding) as (title,
    headers, rows); last row = macro mean."""
    shown = [("Grounding (percent; CNR a ratio)", results["grounding"], ("pairs",), SUMMARY_GROUNDING, True),
             ("Recognition (percent)", results["classification"], ("positives", "negatives"), SUMMARY_RECOGNITION,
              False)]
    phrases = results.get("phrase_grounding")
    if phrases:
        how = "the report phrase" if phrases["query_mode"] == "phrase" else "the finding's map (fixed vocabulary)"
        shown.append((f"Phrase grounding, each query grounded by {how} (percent; CNR a ratio)",
                      phrases["by_query"], ("pairs",), SUMMARY_GROUNDING, True))
        if phrases["by_finding_name"] is not None:
            shown.append(("Phrase grounding, the same queries grounded by the finding's name (percent; CNR a ratio)",
                          phrases["by_finding_name"], ("pairs",), SUMMARY_GROUNDING, True))
    for name, (title, columns) in SUMMARY_CHECKS.items():
        section = results.get(name) or {}
        if section.get("applicable"):
            shown.append((title.format(images=counted(section["images"], "image")), section, ("pairs",), columns, True))
    tables = []
    for title, section, counts, columns, summed in shown:
        headers = ("Finding", *(metric(n).short for n in counts + columns))
        tables.append((title, headers, _summary_table(results, section, counts, columns, summed)))
    return tables


def summary_footnotes(results: dict) -> list[str]:
    g, d = results["grounding"], results["data"]
    calibration = (
        []
        if results["classification"]["calibrated_logits"]
        else [
            f"{results['model']}'s scores are not calibrated probabilities: F1 and accuracy at p ≥ 0.5 apply an "
            "arbitrary cut for it; AUROC, AUPRC and max-F1 depend only on the ranking."
        ]
    )
    edge = {name: sum(v[name] for v in g["per_class"].values()) for name in ("constant_maps", "tied_maxima", "empty_masks")}
    notes = [
        "PG = Pointing Game: a hit when a pixel at the map's maximum lies in the region (ties count if any tied "
        "pixel is inside; a constant map is a miss). Dice/IoU: per-image means over graded (image, class) pairs.",
        "* chosen on the evaluated set itself (the paper's protocol): 'best' is the threshold τ that maximises "
        "the metric for that class, max-F1 the best probability threshold. Compare with τ = 0.5 and p ≥ 0.5.",
        f"Images evaluated: {d['images_evaluated']} of {d['images_in_split']}. Edge cases: "
        f"{edge['constant_maps']} constant maps, {edge['tied_maxima']} maps with tied maxima, "
        f"{edge['empty_masks']} pairs with an empty mask (left out); {d['clipped_shapes']} shapes clipped at the "
        f"image border; {sum(d['lost_regions'].values())} annotated regions empty in the frame (left out).",
        "CNR: contrast-to-noise ratio, |mean inside − mean outside| / √(var inside + var outside) of the normalised "
        "map, averaged over the pairs where it is defined (a constant map scores 0; a region covering the frame, or a "
        "map exactly constant inside and outside, has none).",
        *calibration,
        *_explainer_notes(results.get("explainer")),
        *_phrase_notes(results.get("phrase_grounding")),
        *_check_notes(results),
        *_chexlocalize_notes((results.get("precomputed") or {}).get("chexlocalize_protocol")),
    ]
    return notes


def _chexlocalize_notes(protocol: dict | None) -> list[str]:
    """What cheXlocalize's rules left out of their means, in a run that scored their protocol."""
    if not protocol:
        return []
    total = lambda name: sum(v[name] for v in protocol["per_class"].values())  # noqa: E731
    return [f"cheXlocalize's protocol at native size (metrics.json: precomputed.chexlocalize_protocol): as their "
            f"eval.py's default true_pos_only, {total('chexlocalize_iou_fixed_left_out')} pairs with an empty "
            f"fixed-threshold segmentation and {total('chexlocalize_iou_otsu_left_out')} with an empty Otsu "
            f"segmentation are left out of their IoU means; {total('empty_masks')} regions empty at native size "
            "are left out of every value."]


def _explainer_notes(explainer: dict | None) -> list[str]:
    """Which CAM method made the maps, and of what; nothing for the model's own maps."""
    if not explainer or explainer["label"] is None:
        return []
    return [f"Maps: {explainer['label']} ({explainer['library']}) on the layer {explainer['layer']}, explaining "
            f"{explainer['score']}. After the library's ReLU, a map without positive evidence is constant (a miss)."]


def _check_notes(results: dict) -> list[str]:
    """What the explanation tables mean, or why a section asked for (or scored on every run) did not apply."""
    notes = []
    for name in SUMMARY_CHECKS:
        section = results.get(name)
        if section is None:
            continue
        if not section.get("applicable"):
            notes.append(f"{name.capitalize()} not scored: {section['reason']}.")
        elif name == "faithfulness":
            notes.append(
                f"Faithfulness ({section['steps']} deletion/insertion steps, ROAD at percentiles "
                f"{', '.join(map(str, section['road_percentiles']))}): deletion AUC lower and insertion AUC and ROAD "
                f"higher are more faithful; {section['constant_maps']} constant maps left out. Definitions: "
                "docs/explanations.md.")
        elif name == "sanity":
            notes.append(
                f"Sanity: after the last of {len(section['steps']) - 1} cascade steps; lower is a map that depends "
                "on the weights (meaningful with the authors' weights only). Each step: sanity.csv.gz, the report.")
        elif name == "robustness":
            notes.append(
                f"Robustness: the largest change of the map over {counted(section['samples'], 'noisy copy', 'noisy copies')} of the input per "
                f"image (uniform within ±{section['radius']:g} for max-sensitivity, Gaussian σ = {section['std']:g} "
                f"for the local Lipschitz estimate, seed {section['seed']}); lower is more robust.")
        elif name == "localisation":
            notes.append(
                f"Localisation: higher is better; top-k takes the {section['top_k']} most relevant of the frame's "
                f"pixels; equal values at a cut share its places (docs/explanations.md); {section['constant_maps']} "
                "constant maps taken as uniform.")
        elif name == "gaze":
            undefined = {key: n for key, n in section["undefined"].items() if n}
            notes.append(
                "Gaze: the saliency field's metrics (pysaliency's) and NCC/sNCC (etsaliencymaps'); higher is better but "
                "for KL; IG in bits per fixation over the dataset's centre bias (0: the centre bias)"
                + (f"; undefined and left out: {', '.join(f'{k} {n}' for k, n in undefined.items())}" if undefined
                   else "") + ". Definitions: docs/gaze.md.")
    return notes


def _phrase_notes(phrases: dict | None) -> list[str]:
    """The phrase-vs-name paired differences (macro means with their intervals), when there are any."""
    if not phrases:
        return []
    intervals = phrases["intervals"]
    if "phrase_minus_name" not in intervals:
        return [f"Queries are grounded by their finding's map (query_mode {phrases['query_mode']}): the model has "
                "a fixed vocabulary or no text side, so its phrase and finding-name results are one and the same."]
    level = round(100 * intervals["confidence"])

    def difference(key: str) -> str:
        value = intervals["phrase_minus_name"][key]["macro"]
        if value["estimate"] is None:
            return f"{metric(key).short} –"
        scale = 100 if metric(key).unit == "percent" else 1
        return (f"{metric(key).short} {scale * value['estimate']:+.2f} "
                f"[{scale * value['lower']:+.2f}, {scale * value['upper']:+.2f}]")

    shown = ", ".join(difference(key) for key in intervals["phrase_minus_name"])
    return [f"Report phrase minus finding name, macro mean over findings, paired over the same queries "
            f"({level} % bootstrap interval over images, {intervals['replicates']} replicates): {shown}."]


def summary_markdown(results: dict) -> str:
    lines = [
        f"# {results['model']} on {results['dataset']}",
        "",
        f"Run {results['created']}, XBench {results['versions']['xbench']}, schema `{results['schema']}`.",
    ]
    for title, headers, rows in summary_tables(results):
        lines += ["", f"## {title}", "", *markdown_grid(list(headers), rows)]
    lines += [""] + [f"{note}  " for note in summary_footnotes(results)]
    return "\n".join(lines) + "\n"


def print_summary(results: dict, path: Path | None, wandb_runs: list[str], console: Console | None = None) -> None:
    """The run's tables and notes on the console, then where its results and W&B runs went
    (``wandb_runs``: a line each, from `xbench.reporting.wandb.finish_runs`)."""
    console = console or Console()
    console.rule(f"[bold]{results['model']} on {results['dataset']}")
    for title, headers, rows in summary_tables(results):
        print_table(console, title, headers, rows, total_row=True)
    for note in summary_footnotes(results):
        console.print(note, style="dim")
    if path is not None:
        console.print(f"Results written to [bold]{path}[/bold]")
    for line in wandb_runs:
        console.print(line)
