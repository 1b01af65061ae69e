"""The README and the docs site hold together, without MkDocs: every page is in mkdocs.yml's nav, the README's links
resolve, the README stays one to two screens, and its layout names every library package. (`make docs` runs the full
`mkdocs build --strict`.)"""

from __future__ import annotations

import re

import yaml

from conftest import ROOT
from test_e2e import _readme_command

README = ROOT / "README.md"
DOCS = ROOT / "docs"
LINK = re.compile(r"\[[^\]]*\]\(([^)\s]+)\)")


def _nav_pages(nav) -> list[str]:
    pages = []
    for entry in nav:
        value = next(iter(entry.values())) if isinstance(entry, dict) else entry
        pages += _nav_pages(value) if isinstance(value, list) else [value]
    return pages


def _anchors(page) -> set[str]:
    """Heading slugs as GitHub and MkDocs make them for these pages: lower case, punctuation dropped, spaces → -."""
    headings = re.findall(r"^#+\s+(.+?)\s*$", page.read_text(), flags=re.M)
    return {re.sub(r"[\s]+", "-", re.sub(r"[^\w\s-]", "", h.replace("`", "")).strip().lower()) for h in headings}


def test_every_docs_page_is_in_the_nav_and_every_nav_entry_exists():
    config = yaml.safe_load((ROOT / "mkdocs.yml").read_text())
    nav = _nav_pages(config["nav"])
    assert sorted(nav) == sorted(p.name for p in DOCS.glob("*.md"))
    assert (DOCS / "benchmarks.md").resolve() == (ROOT / "BENCHMARKS.md").resolve()  # one file, not a copy


def test_readme_links_resolve():
    links = [link for link in LINK.findall(README.read_text()) if not re.match(r"[a-z]+:", link)]
    assert any(link.startswith("docs/") for link in links)
    for link in links:
        path, _, anchor = link.partition("#")
        target = ROOT / path
        assert target.is_file(), f"README links to {link}, which does not exist"
        if anchor:
            assert anchor in _anchors(target), f"README links to {link}: no such heading"


def test_readme_is_one_to_two_screens():
    lines = README.read_text().splitlines()
    assert len(lines) <= 150
    assert [n for n, line in enumerate(lines, 1) if len(line) > 120] == []


def test_readme_layout_names_every_library_package():
    """The layout block is at most 25 lines; it names every package of the library by its folder and every module
    at the library's top, and nothing it names under src/ampbench/ is gone (packages map their own modules)."""
    block = README.read_text().split("## Layout", 1)[1].split("```")[1].strip().splitlines()
    assert len(block) <= 25, f"the layout block has {len(block)} lines"
    library = ROOT / "src" / "ampbench"
    inside = block[next(i for i, line in enumerate(block) if "src/ampbench/" in line) + 1:]
    inside = inside[:next(i for i, line in enumerate(inside) if not line.startswith("│"))]
    folders = {re.search(r"(\w+)/", line).group(1) for line in inside if re.search(r"── \w+/", line)}
    modules = {m for line in inside for m in re.findall(r"\b(\w+)\.py\b", line.split("#")[0])}
    packages = {p.parent.name for p in library.glob("*/__init__.py")}
    assert folders == packages, f"packages missing: {packages - folders}; named but gone: {folders - packages}"
    assert modules == {p.stem for p in library.glob("*.py")}, "the library's top-level modules, each named"


def test_the_commands_the_end_to_end_tests_run_are_the_intended_ones():
    """test_e2e runs these lines verbatim, found by prefix in README.md, then docs/*.md."""
    assert "examples.my_model:build" in _readme_command(".venv/bin/dvc exp run --temp -S train.model=examples.")
    assert _readme_command(".venv/bin/dvc exp run --temp -S 'train.precisions=[fp32,bf16]'").endswith(
        "-S 'train.seeds=[0,1,2,3,4]'")
    assert "not_worse|speedup_vs_fp32" in _readme_command(".venv/bin/dvc exp show --drop")
