"""The documentation site as a reader gets it: docstrings in the Markdown that mkdocstrings renders,
and the built pages free of raw Sphinx roles, lost ``τ*`` marks and unresolved cross-references,
with wide tables that scroll; and what a newcomer's pages render: the home page's results as
tables, τ and ≥ in the API's prose, code keys in tables whole, the pairs matrix's scroll hint, a
name found by search inside its dotted path."""

from __future__ import annotations

import re
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]
#: A Sphinx role as written in a docstring (``:func:`x```) or as it reaches a page (``:func:<code>``).
SPHINX_ROLE = re.compile(r":(?:py:)?(?:func|class|meth|attr|mod|data|exc|obj|const|ref|doc|term):(?:`|<code)")
#: Markdown's emphasis where ``τ*`` was meant: the asterisk paired with another and vanished.
LOST_TAU_STAR = re.compile(r"τ</?em>")
#: A Markdown cross-reference that was not turned into a link.
RAW_AUTOREF = re.compile(r"\]\[xbench\.")
TABLES_CSS = "stylesheets/tables.css"


def test_docstrings_use_markdown_cross_references():
    """Sphinx roles stay literal on the site: every docstring and comment of xbench/ uses Markdown
    autorefs (``[`name`][xbench.full.path]``) or plain code instead."""
    offenders = [f"{path.relative_to(ROOT)}:{number}: {line.strip()}"
                 for path in sorted((ROOT / "xbench").rglob("*.py"))
                 for number, line in enumerate(path.read_text(encoding="utf-8").splitlines(), start=1)
                 if SPHINX_ROLE.search(line)]
    assert not offenders, "Sphinx roles (write [`name`][xbench.path] or `name`):\n" + "\n".join(offenders)


@pytest.fixture(scope="module")
def site(tmp_path_factory) -> Path:
    """The site built strictly (a warning, such as an unresolved cross-reference, fails the build)
    into a temporary folder."""
    from mkdocs.commands.build import build
    from mkdocs.config import load_config

    folder = tmp_path_factory.mktemp("site")
    build(load_config(str(ROOT / "mkdocs.yml"), site_dir=str(folder), strict=True))
    return folder


#: Code on a page (a span or a block): shown as written, so it may spell a role or an autoref.
CODE = re.compile(r"<(code|pre)\b.*?</\1>", re.DOTALL)


def pages(site: Path) -> dict[str, str]:
    return {str(path.relative_to(site)): path.read_text(encoding="utf-8") for path in sorted(site.rglob("*.html"))}


def matches(site: Path, pattern: re.Pattern) -> list[str]:
    """Where ``pattern`` occurs in the pages' text outside code (each code element left as an empty
    ``<code>``, so that a role in front of one still shows)."""
    found = []
    for name, html in pages(site).items():
        text = CODE.sub("<code>", html)
        found += [f"{name}: …{text[max(0, m.start() - 60):m.end() + 60]}…" for m in pattern.finditer(text)]
    return found


@pytest.mark.slow
def test_pages_show_no_sphinx_role(site):
    found = matches(site, SPHINX_ROLE)
    assert not found, "raw Sphinx roles on the site:\n" + "\n".join(found)


@pytest.mark.slow
def test_tau_star_keeps_its_asterisk(site):
    """``τ*`` marks a threshold chosen on the evaluated set; unescaped, two of them make italics."""
    found = matches(site, LOST_TAU_STAR)
    assert not found, "τ* lost to emphasis (write τ\\* in Markdown):\n" + "\n".join(found)
    for page in ("index.html", "reporting/index.html"):
        assert "τ*" in (site / page).read_text(encoding="utf-8"), page


@pytest.mark.slow
def test_cross_references_resolve(site):
    """Every docstring cross-reference is a link (the strict build refuses one without a target)."""
    found = matches(site, RAW_AUTOREF)
    assert not found, "cross-references left as text:\n" + "\n".join(found)
    models = (site / "api/models/index.html").read_text(encoding="utf-8")
    assert 'href="#xbench.models.explainers.explainer_record"' in models


@pytest.mark.slow
def test_wide_tables_scroll(site):
    """Every page loads the tables' style, which lets the box around a table scroll sideways; the
    theme puts every table (none has a class) into that box."""
    unstyled = [name for name, html in pages(site).items()
                if "<table" in html and f'href="{"../" * name.count("/")}{TABLES_CSS}"' not in html]
    assert not unstyled, f"pages without {TABLES_CSS}: {unstyled}"
    css = (site / TABLES_CSS).read_text(encoding="utf-8")
    assert re.search(r"\.md-typeset__scrollwrap[^{]*\{[^}]*overflow-x:\s*auto", css)
    assert not matches(site, re.compile(r"<table\s[^>]*class=")), "a table with a class escapes the theme's box"
    (bundle,) = (site / "assets/javascripts").glob("bundle.*.min.js")
    script = bundle.read_text(encoding="utf-8")
    assert "table:not([class])" in script and "md-typeset__scrollwrap" in script


# -- what a newcomer's pages render (issue 50) --------------------------------------------------

#: What a page's script and style elements hold: never shown as text.
SCRIPTS = re.compile(r"<(script|style)\b.*?</\1>", re.DOTALL)
TAG = re.compile(r"<[^>]+>")


def shown_text(html: str, code: bool = True) -> str:
    """The text a reader sees: scripts and tags gone, entities read (``&lt;br&gt;`` is the text
    ``<br>``); without ``code`` also without code spans and blocks."""
    import html as entities

    html = SCRIPTS.sub(" ", html)
    return entities.unescape(TAG.sub(" ", html if code else CODE.sub(" ", html)))


@pytest.mark.slow
def test_the_home_page_renders_its_results_excerpt(site):
    """README's excerpt of the demo's report is tables on the home page, not Markdown shown raw."""
    html = (site / "index.html").read_text(encoding="utf-8")
    text = shown_text(html)
    assert "<br>" not in text and "**" not in text, "raw Markdown on the home page"
    assert "<strong>17.5 [16.3, 19.0]</strong>" in html and "Phantom<br>PG" in html
    assert "Dice@τ*" in text


@pytest.mark.slow
def test_the_api_pages_write_tau_and_comparisons_as_the_site_does(site):
    """Docstrings write τ, ≥ and ≤ in their prose, as the pages written by hand do (code keeps ``>=``)."""
    found = [f"{name}: …{text[max(0, m.start() - 60):m.end() + 30]}…"
             for name, html in pages(site).items() if name.startswith("api/")
             for text in [shown_text(html, code=False)]
             for m in re.finditer(r"\btau\b|>=|<=", text)]
    assert not found, "write τ, ≥, ≤ in docstrings:\n" + "\n".join(found)


def specificity(selector: str) -> tuple[int, int]:
    """A compound selector's (classes, elements) count, enough to order the rules compared here."""
    return selector.count("."), len(re.findall(r"(?:^|\s)[a-z]+", selector))


@pytest.mark.slow
def test_a_code_key_in_a_table_never_breaks_inside_a_word(site):
    """The theme lets code break anywhere (``word-break: break-word``), so a narrow column split
    ``relevance_m|ass``; the tables' style undoes it for table cells, with a selector that wins."""
    css = (site / TABLES_CSS).read_text(encoding="utf-8")
    rules = {selector.strip(): body for selectors, body in re.findall(r"([^{}]+)\{([^}]*)\}", css)
             for selector in selectors.split(",")}
    ours = [s for s, body in rules.items() if s.endswith("td code")
            and re.search(r"word-break:\s*normal", body) and re.search(r"overflow-wrap:\s*normal", body)]
    (theme_css,) = (site / "assets/stylesheets").glob("main.*.min.css")
    theme = re.search(r"(\.md-typeset code)\{[^}]*word-break:break-word", theme_css.read_text(encoding="utf-8"))
    assert ours and theme, (ours, theme)
    assert specificity(ours[0]) > specificity(theme[1])
    metrics = (site / "metrics/index.html").read_text(encoding="utf-8")
    assert re.search(r"<td><code>relevance_mass</code></td>", metrics)  # the key seen broken, in a table


@pytest.mark.slow
def test_the_pairs_matrix_says_it_scrolls(site):
    """The matrix is wider than the page at 1280 px: the line above it says how to see its last columns."""
    html = (site / "pairs/index.html").read_text(encoding="utf-8")
    before = html[:html.index("<table")]
    last_paragraph = before[before.rindex("<p>"):]
    assert "scrolls" in last_paragraph and "sideways" in last_paragraph, last_paragraph


@pytest.mark.slow
def test_search_finds_a_name_inside_its_dotted_path(site):
    """The search index splits words as the site's search does (its ``separator``), so "XBenchModel"
    finds Your own model / dataset, which names the class by its path."""
    import json

    index = json.loads((site / "search/search_index.json").read_text(encoding="utf-8"))
    separator = re.compile(index["config"]["separator"])

    def words(location: str) -> set[str]:
        return {word.lower() for doc in index["docs"] if doc["location"].startswith(location)
                for word in separator.split(TAG.sub(" ", doc["title"] + " " + doc["text"])) if word}

    assert "xbenchmodel" in words("your-own/")
    assert {"xbench", "models", "base"} <= words("your-own/")
    assert "0.5" in words("metrics/")  # a number keeps its dot
