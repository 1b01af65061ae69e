"""The names a user's code imports: at the top level, listed in ``__all__`` and in docs/your-task.md, loaded lazily
(no torch for ``import ampbench``), used by every example and doc; an old module path fails with one line naming
the new place."""

from __future__ import annotations

import re
import subprocess
import sys

import pytest

import ampbench
from conftest import ROOT


def test_the_top_level_exports_the_task_contract_and_the_built_ins():
    from ampbench import GPT, Classification, LanguageModel, Task
    from ampbench.models.gpt import GPT as DefinedGPT
    from ampbench.tasks.contract import Task as DefinedTask

    assert Task is DefinedTask and GPT is DefinedGPT
    assert issubclass(Classification, Task) and issubclass(LanguageModel, Task)
    assert set(ampbench.__all__) == set(ampbench._EXPORTS) and set(ampbench.__all__) <= set(dir(ampbench))
    for name in ampbench.__all__:
        assert getattr(ampbench, name) is not None
    with pytest.raises(AttributeError, match="no attribute 'nothing_here'"):
        ampbench.nothing_here  # noqa: B018


def test_docs_list_exactly_the_exported_names():
    table = (ROOT / "docs" / "your-task.md").read_text().split("## What your code imports", 1)[1]
    listed = {n for row in re.findall(r"^\| (`[^|]+`) \|", table, flags=re.M) for n in re.findall(r"`(\w+)`", row)}
    assert listed == set(ampbench.__all__)


def test_importing_ampbench_loads_no_torch():
    code = "import sys, ampbench; print('torch' in sys.modules)"
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True).stdout
    assert out.strip() == "False"


@pytest.mark.parametrize("old, new", [("ampbench.task", "from ampbench import Task, Classification"),
                                      ("ampbench.gpt", "from ampbench import GPT"),
                                      ("ampbench.model_factory", "ampbench.models.factory")])
def test_an_old_module_path_fails_with_one_line_naming_the_new_one(old, new):
    code = f"import {old}"
    run = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True)
    assert run.returncode == 1
    last = run.stderr.strip().splitlines()[-1]
    assert last.startswith(f"ModuleNotFoundError: {old} moved") and new in last


def test_examples_and_docs_import_from_the_top_level_only():
    deep = re.compile(r"^\s*(?:from ampbench\.[\w.]+ import|import ampbench\.)", re.M)
    texts = {p: p.read_text() for p in [*(ROOT / "examples").glob("*.py"), *(ROOT / "docs").glob("*.md"),
                                         ROOT / "README.md"]}
    assert [str(p.relative_to(ROOT)) for p, text in texts.items() if deep.search(text)] == []
    assert "from ampbench import" in texts[ROOT / "examples" / "my_task.py"]
