"""The shape of the code, checked: one module talks to MLflow, the import graph has no cycles, the stages do not
import each other, and the output layout in layout.py is the one dvc.yaml declares."""

from __future__ import annotations

import ast
from pathlib import Path

import yaml

from ampbench import layout
from conftest import ROOT

SRC = ROOT / "src" / "ampbench"


def _imports(path: Path) -> set[str]:
    """Every module ``path`` imports (at any depth, lazily or not), except under ``if TYPE_CHECKING:``."""
    tree = ast.parse(path.read_text())
    skip = {id(n) for node in ast.walk(tree) if isinstance(node, ast.If) and "TYPE_CHECKING" in ast.unparse(node.test)
            for child in node.body for n in ast.walk(child)}
    names = set()
    for node in ast.walk(tree):
        if id(node) in skip:
            continue
        if isinstance(node, ast.Import):
            names.update(a.name for a in node.names)
        elif isinstance(node, ast.ImportFrom) and node.module:
            names.add(node.module)
            names.update(f"{node.module}.{a.name}" for a in node.names)
    return names


def _graph() -> dict[str, set[str]]:
    modules = {p.stem for p in SRC.glob("*.py")}
    return {p.stem: {n.split(".")[1] for n in _imports(p) if n.startswith("ampbench.") and n.split(".")[1] in modules}
            - {p.stem} for p in SRC.glob("*.py")}


def test_only_the_tracking_module_imports_mlflow():
    files = [*SRC.glob("*.py"), *(ROOT / "pipeline").glob("*.py")]
    users = sorted(p.name for p in files if any(n == "mlflow" or n.startswith("mlflow.") for n in _imports(p)))
    assert users == ["tracking.py"]


def test_the_library_has_no_import_cycles():
    graph = _graph()
    done: set[str] = set()

    def visit(module: str, path: list[str]) -> None:
        assert module not in path, f"import cycle: {' → '.join(path[path.index(module):] + [module])}"
        if module not in done:
            for dep in sorted(graph[module]):
                visit(dep, [*path, module])
            done.add(module)

    for module in sorted(graph):
        visit(module, [])


def test_stages_do_not_import_each_other():
    graph = _graph()
    assert "train_stage" not in graph["evaluate_stage"] and "evaluate_stage" not in graph["train_stage"]
    assert "bench" not in graph["benchloop"]


def test_layout_matches_dvc_yaml():
    stages = yaml.safe_load((ROOT / "dvc.yaml").read_text())["stages"]
    assert stages["prepare"]["outs"] == [str(layout.PREPARED)]
    assert stages["train"]["outs"] == [f"{layout.MODELS}/${{item.precision}}"]
    reports = layout.ReportFiles(layout.REPORTS)
    declared = {next(iter(o)) if isinstance(o, dict) else o
                for o in stages["evaluate"]["outs"] + stages["evaluate"]["metrics"]}
    assert "plots" not in stages["evaluate"]  # a stage-level plot would draw a raw panel beside the top-level ones
    assert declared == {str(p) for p in (reports.report, reports.details, reports.figures, reports.comparison,
                                         reports.speed, reports.curves)}
    assert str(layout.RESUME) in (ROOT / ".gitignore").read_text()  # resume checkpoints are never DVC outputs
