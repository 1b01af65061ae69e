"""The README and the docs site hold together, without MkDocs: every page is in mkdocs.yml's nav, the README's links
resolve, the README stays one to two screens, and its layout names every library module. (`make docs` runs the full
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


def test_readme_layout_names_every_library_module():
    """Every module, and every package (by its folder), has its line; nothing named is gone."""
    layout = README.read_text().split("## Layout", 1)[1].split("\n## ", 1)[0]
    named = set(re.findall(r"\b(\w+)\.py\b", layout)) | set(re.findall(r"\b(\w+)/ ", layout))
    library = ROOT / "src" / "ampbench"
    packages = {p.parent.name for p in library.glob("*/__init__.py")}
    modules = {p.stem for p in library.glob("*.py")} - {"__init__"}
    assert (modules | packages) - named == set(), "modules missing from the README's layout"
    inside = {p.stem for package in packages for p in (library / package).glob("*.py")}
    others = {"check", "prepare", "train", "speed", "evaluate", "my_model", "overflow_model",  # pipeline/ and examples/
              "pipeline", "scripts", "examples", "data", "raw", "prepared", "tests", "docs", "ampbench"}  # folders
    assert named - modules - packages <= inside | others, "the README's layout names modules that no longer exist"


def test_the_commands_the_end_to_end_tests_run_are_the_intended_ones():
    """test_e2e runs these lines verbatim, found by prefix in README.md, then docs/*.md."""
    assert "examples.my_model:build" in _readme_command(".venv/bin/dvc exp run --temp -S train.model=examples.")
    assert _readme_command(".venv/bin/dvc exp run --temp -S 'train.precisions=[fp32,bf16]'").endswith(
        "-S 'train.seeds=[0,1,2,3,4]'")
    assert "not_worse|speedup_vs_fp32" in _readme_command(".venv/bin/dvc exp show --drop")
