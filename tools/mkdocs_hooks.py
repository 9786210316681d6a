"""MkDocs hooks: pages that are made from the repository at build time, so nothing is written twice.

A page asks for generated text with an HTML comment (invisible where the Markdown is read raw,
on a code host):

- ``<!-- xbench:file README.md -->``: a file of the repository root, its links to ``docs/`` pages
  made relative to the site (the home page is the README; the changelog page is CHANGELOG.md).
- ``<!-- xbench:include models/medklip.md "Weights" -->``: the section under that heading of
  another page, its links made relative to the including page (a page that gathers one run's
  steps without a second copy of them).
- ``<!-- xbench:pairs SUITE.yaml [SUITE.yaml ...] -->``: the command ``python -m xbench.suite
  --mode per-pair`` runs for every model and dataset of the suites, from the suite's own argument
  builder; every model and dataset needs its page (``models/<config>.md``, ``datasets/<config>.md``).
- ``<!-- xbench:metric-names -->``: the table of every metric's key, labels and unit, from
  ``xbench/metrics/names.py``.
- ``<!-- xbench:classes rsna -->``: a dataset's classes, names and raw spellings, from
  ``xbench/findings.py``.
- ``<!-- xbench:cam-targets -->``: the table of every model's CAM layer and class score, from each
  model class's ``cam_target`` (``xbench/models/explainers.py``).

A directive that cannot be served (a missing file, heading or page) stops the build.
"""

from __future__ import annotations

import posixpath
import re
import shlex
from pathlib import Path

DIRECTIVE = re.compile(r"<!-- xbench:(?P<name>[\w-]+)(?P<args>[^>]*?)-->")
#: A Markdown link or image target: ``](target)``, the target without spaces.
LINK = re.compile(r"\]\((?P<target>[^)\s]+)\)")
HEADING = re.compile(r"^(?P<hashes>#{1,6})\s+(?P<text>.+?)\s*$")


class DirectiveError(ValueError):
    pass


def on_page_markdown(markdown: str, page, config, files) -> str:
    root = Path(config["config_file_path"]).parent
    docs = Path(config["docs_dir"])
    here = page.file.src_uri

    def expand(match: re.Match) -> str:
        name, args = match["name"], shlex.split(match["args"])
        try:
            if name == "file":
                return repository_file(root, args[0], here)
            if name == "include":
                return include_section(docs, args[0], args[1], here)
            if name == "pairs":
                return suite_pairs(root, docs, args, here)
            if name == "metric-names":
                return metric_names()
            if name == "classes":
                return dataset_classes(args[0])
            if name == "cam-targets":
                return cam_targets()
        except (IndexError, OSError, LookupError) as error:
            raise DirectiveError(f"{here}: {match[0]}: {error}") from error
        raise DirectiveError(f"{here}: unknown directive {match[0]}")

    return DIRECTIVE.sub(expand, markdown)


# -- links ------------------------------------------------------------------------------------


def is_relative(target: str) -> bool:
    return not (target.startswith(("#", "/", "mailto:")) or re.match(r"^[a-z][a-z0-9+.-]*://", target))


def relink(markdown: str, source_dir: str, page: str, own_page: str | None) -> str:
    """Links of Markdown written in ``source_dir`` (docs-relative; ``..`` is the repository root),
    rewritten relative to ``page``; a bare ``#anchor`` points at ``own_page``."""

    def fix(match: re.Match) -> str:
        target = match["target"]
        if target.startswith("#") and own_page is not None:
            return f"]({posixpath.relpath(own_page, posixpath.dirname(page) or '.')}{target})"
        if not is_relative(target):
            return match[0]
        path, _, anchor = target.partition("#")
        resolved = posixpath.normpath(posixpath.join(source_dir, path))
        if resolved.startswith(".."):
            raise DirectiveError(f"a link to {target!r} leaves the documentation; link a page under docs/")
        relative = posixpath.relpath(resolved, posixpath.dirname(page) or ".")
        return f"]({relative}{'#' + anchor if anchor else ''})"

    return LINK.sub(fix, markdown)


#: Root files that are pages of the site, by the page they are.
ROOT_PAGES = {"CHANGELOG.md": "changelog.md"}


def repository_file(root: Path, name: str, page: str) -> str:
    """A root file (README.md, CHANGELOG.md) as a page: its links to ``docs/...`` and to the root
    files that are pages point at the site's pages."""

    def to_docs(match: re.Match) -> str:
        path, _, anchor = match["target"].partition("#")
        path = ROOT_PAGES.get(path, path.removeprefix("docs/") if path.startswith("docs/") else None)
        return match[0] if path is None else f"]({path}{'#' + anchor if anchor else ''})"

    return relink(LINK.sub(to_docs, (root / name).read_text()), ".", page, None)


# -- sections of other pages ------------------------------------------------------------------


def headings(lines: list[str]):
    """``(line number, level, text)`` of each Markdown heading, fenced code blocks skipped (a
    shell comment is not a heading)."""
    fenced = False
    for number, line in enumerate(lines):
        if line.lstrip().startswith("```"):
            fenced = not fenced
            continue
        found = None if fenced else HEADING.match(line)
        if found:
            yield number, len(found["hashes"]), found["text"]


def include_section(docs: Path, source: str, heading: str, page: str) -> str:
    """The text under ``heading`` in ``source`` (to the next heading of its level or above)."""
    lines = (docs / source).read_text().splitlines()
    start = level = None
    end = len(lines)
    for number, depth, text in headings(lines):
        if start is None and text == heading:
            start, level = number + 1, depth
        elif start is not None and depth <= level:
            end = number
            break
    if start is None:
        raise LookupError(f"no heading {heading!r} in {source}")
    return relink("\n".join(lines[start:end]), posixpath.dirname(source), page, source)


# -- the suite's pairs ------------------------------------------------------------------------


def page_title(docs: Path, page: str) -> str:
    path = docs / page
    if not path.is_file():
        raise LookupError(f"{page} is missing: every model and dataset of a suite needs its page")
    for _, level, text in headings(path.read_text().splitlines()):
        if level == 1:
            return text
    raise LookupError(f"{page} has no '# title' line")


def slug(text: str) -> str:
    """The anchor MkDocs' table of contents gives a heading (its default ``toc.slugify``)."""
    from markdown.extensions.toc import slugify

    return slugify(text, "-")


#: Said above the pairs matrix, wider than the page on a laptop's screen: its box scrolls sideways.
SCROLL_HINT = ("*One column per dataset: where the table is wider than the page (a laptop's screen), it scrolls "
               "sideways (shift + wheel, or swipe) to the last ones.*")


def suite_pairs(root: Path, docs: Path, suite_files: list[str], page: str) -> str:
    """A table of every model and dataset of the suites (below `SCROLL_HINT`), then the command of
    each pair: the arguments ``xbench.suite`` gives the pair's ``python -m xbench.test`` (from the
    first suite that lists the pair)."""
    from xbench.suite import Pair, load_suite, run_arguments

    suites = [(name, load_suite(root / name)) for name in suite_files]
    models = list(dict.fromkeys(m.configs for _, suite in suites for m in suite.models))
    datasets = list(dict.fromkeys(d.configs for _, suite in suites for d in suite.datasets))
    here = posixpath.dirname(page) or "."

    def link(kind: str, configs) -> tuple[str, str]:
        target = f"{kind}/{configs[0].stem}.md"
        title = page_title(docs, target)
        return title, f"[{title}]({posixpath.relpath(target, here)})"

    def command(model, dataset) -> tuple[str, list[str]] | None:
        found = [(name, suite) for name, suite in suites
                 if any(m.configs == model for m in suite.models) and any(d.configs == dataset for d in suite.datasets)]
        if not found:
            return None
        suite = found[0][1]
        pair = Pair(next(m for m in suite.models if m.configs == model),
                    next(d for d in suite.datasets if d.configs == dataset))
        flags = list(zip(*[iter(run_arguments(suite, pair))] * 2))
        configs = [part for flag, value in flags if flag == "--config" for part in (flag, value)]
        settings = [part for flag, value in flags if flag != "--config" for part in (flag, value)]
        text = " \\\n    ".join([shlex.join(["python", "-m", "xbench.test", *configs]), shlex.join(settings)])
        return text, [Path(name).stem for name, _ in found]

    titles = {m: link("models", m) for m in models} | {d: link("datasets", d) for d in datasets}
    table = ["| model | " + " | ".join(titles[d][1] for d in datasets) + " |",
             "|---|" + "---|" * len(datasets)]
    sections = []
    for model in models:
        model_title, model_link = titles[model]
        cells = []
        sections += [f"## {model_title}", "",
                     f"{model_link}: the files to place in its `checkpoint_dir` and what it computes.", ""]
        for dataset in datasets:
            found = command(model, dataset)
            if found is None:
                cells.append("")
                continue
            text, names = found
            heading = f"{model_title} on {titles[dataset][0]}"
            cells.append(f"[{'/'.join(names)}](#{slug(heading)})")
            sections += [f"### {heading}", "",
                         f"Data: {titles[dataset][1]}. In the suites: {', '.join(f'`{n}`' for n in names)}.", "",
                         "```bash", text, "```", ""]
        table.append(f"| {model_link} | " + " | ".join(cells) + " |")
    return "\n".join([SCROLL_HINT, "", *table, "", *sections])


# -- the metric names ---------------------------------------------------------------------------


def metric_names() -> str:
    from xbench.metrics.names import ANALYSIS_ONLY, METRICS

    rows = ["| key | section | column | meaning | unit | chosen on the evaluated set |",
            "|---|---|---|---|---|---|"]
    for metric in METRICS:
        where = "analysis only" if metric.key in ANALYSIS_ONLY else metric.section
        rows.append(f"| `{metric.key}` | {where} | {metric.short} | {metric.long} | {metric.unit} | "
                    f"{'yes' if metric.chosen else ''} |")
    return "\n".join(rows)


# -- a dataset's classes ------------------------------------------------------------------------


def dataset_classes(dataset: str) -> str:
    from xbench.findings import DEFAULT_CLASSES, FINDINGS, SPELLINGS

    spellings, defaults = SPELLINGS[dataset], DEFAULT_CLASSES[dataset]
    rows = ["| class key | name | short | spelled in the files | default |", "|---|---|---|---|---|"]
    for key in dict.fromkeys([*defaults, *spellings.values()]):
        raw = ", ".join(f"`{spelled}`" for spelled, found in spellings.items() if found == key)
        finding = FINDINGS[key]
        rows.append(f"| `{key}` | {finding.display} | {finding.short} | {raw} | {'yes' if key in defaults else ''} |")
    return "\n".join(rows)


# -- the models' CAM declarations ---------------------------------------------------------------


def cam_targets() -> str:
    from xbench import catalog

    rows = ["| model | layer a CAM reads | tokens before the patches | class score it explains |", "|---|---|---|---|"]
    for cls in catalog.models():
        by_kind = getattr(cls, "cam_targets", None) or {"": cls.cam_target}
        for kind, target in by_kind.items():
            name = f"`{cls.__name__}`" + (f" ({kind} folder)" if kind else "")
            if target is None:
                rows.append(f"| {name} | none: native maps only | | |")
            else:
                prefix = "convolutional" if target.prefix_tokens is None else str(target.prefix_tokens)
                rows.append(f"| {name} | `{target.layer}` | {prefix} | {target.score} |")
    return "\n".join(rows)
