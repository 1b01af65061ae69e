"""The shape of the code, checked: packages by concern one level deep, each mapping its modules; one package talks
to MLflow; the import graph has no cycles between modules or between packages (type-only imports included); the
stages do not import each other; modules and functions stay small; the output layout in config/layout.py is the one
dvc.yaml declares."""

from __future__ import annotations

import ast
from pathlib import Path

import yaml

from ampbench.config import layout
from ampbench.config.params import SECTION_STAGES
from conftest import ROOT

SRC = ROOT / "src" / "ampbench"


def _imports(path: Path) -> set[str]:
    """Every module ``path`` imports, at any depth: lazily inside functions and under ``if TYPE_CHECKING:`` too
    (a cycle of type annotations is still a cycle a reader has to untangle)."""
    names = set()
    for node in ast.walk(ast.parse(path.read_text())):
        if isinstance(node, ast.Import):
            names.update(a.name for a in node.names)
        elif isinstance(node, ast.ImportFrom) and node.module:
            names.add(node.module)
            names.update(f"{node.module}.{a.name}" for a in node.names)
    return names


def _module(path: Path) -> str:
    """``src/ampbench/tracking/store.py`` → ``tracking.store``; a package's ``__init__`` is the package."""
    parts = path.relative_to(SRC).with_suffix("").parts
    return ".".join(parts[:-1] if parts[-1] == "__init__" else parts)


def _graph() -> dict[str, set[str]]:
    """Library module → the library modules it imports (``from ampbench.x import y`` counts module ``x.y`` when
    that is a module, else ``x``)."""
    files = {_module(p): p for p in SRC.rglob("*.py") if _module(p)}
    graph = {}
    for name, path in files.items():
        deps = set()
        for imported in _imports(path):
            if imported.startswith("ampbench."):
                dotted = imported.removeprefix("ampbench.")
                while dotted and dotted not in files:
                    dotted = dotted.rpartition(".")[0]
                if dotted and dotted != name and not name.startswith(dotted + "."):
                    deps.add(dotted)
        graph[name] = deps
    return graph


def test_only_the_tracking_package_imports_mlflow():
    files = [*SRC.rglob("*.py"), *(ROOT / "pipeline").glob("*.py")]
    users = {p for p in files if any(n == "mlflow" or n.startswith("mlflow.") for n in _imports(p))}
    assert users and all(p.parent == SRC / "tracking" for p in users), sorted(map(str, users))


def test_the_library_has_no_import_cycles():
    _no_cycle(_graph())


def _no_cycle(graph: dict[str, set[str]]) -> None:
    done: set[str] = set()

    def visit(node: str, path: list[str]) -> None:
        assert node not in path, f"import cycle: {' → '.join(path[path.index(node):] + [node])}"
        if node not in done:
            for dep in sorted(graph.get(node, ())):
                visit(dep, [*path, node])
            done.add(node)

    for node in sorted(graph):
        visit(node, [])


def test_the_packages_have_no_import_cycles():
    """Layered: between packages (a top-level module counts as its own) the imports run one way."""
    packages: dict[str, set[str]] = {}
    for module, deps in _graph().items():
        top = module.split(".")[0]
        packages.setdefault(top, set()).update(d.split(".")[0] for d in deps if d.split(".")[0] != top)
    _no_cycle(packages)
    assert "training" in packages["stages"] and "stages" not in packages["training"]  # the graph is not empty


def test_the_library_is_packages_one_level_deep():
    """Every module lives in a package by concern, but the command line, the errors and the public surface."""
    assert {p.name for p in SRC.glob("*.py")} == {"__init__.py", "cli.py", "errors.py"}
    assert not [p for p in SRC.glob("*/*/__init__.py")], "packages inside packages"
    for init in SRC.glob("*/__init__.py"):
        doc = ast.get_docstring(ast.parse(init.read_text())) or ""
        modules = {p.stem for p in init.parent.glob("*.py")} - {"__init__", "__main__"}
        assert all(f"``{m}``" in doc or f"``{m}.py``" in doc for m in modules), (
            f"{init.relative_to(ROOT)}: its docstring maps {sorted(m for m in modules if f'``{m}' not in doc)}?")


def test_the_cycle_finder_sees_imports_under_type_checking(tmp_path):
    """The check above would pass vacuously if TYPE_CHECKING blocks were skipped (as they once were)."""
    path = tmp_path / "m.py"
    path.write_text("from typing import TYPE_CHECKING\nif TYPE_CHECKING:\n    from ampbench.bench.config import X\n")
    assert "ampbench.bench.config" in _imports(path)


def test_stages_do_not_import_each_other():
    graph = _graph()
    assert "stages.train" not in graph["stages.evaluate"] and "stages.evaluate" not in graph["stages.train"]
    assert not {"bench", "bench.cli"} & graph["bench.loop"]


MODULE_LINES, FUNCTION_LINES = 300, 50


def test_modules_and_functions_are_small_enough_to_read():
    """No library module over ~300 lines and no function (library or stage) over 50: the largest are named."""
    modules = sorted(((len(p.read_text().splitlines()), _module(p)) for p in SRC.rglob("*.py")), reverse=True)
    functions = sorted(((n.end_lineno - n.lineno + 1, f"{p.relative_to(ROOT)}:{n.name}")
                        for p in [*SRC.rglob("*.py"), *(ROOT / "pipeline").glob("*.py")]
                        for n in ast.walk(ast.parse(p.read_text()))
                        if isinstance(n, (ast.FunctionDef, ast.AsyncFunctionDef))), reverse=True)
    assert modules[0][0] <= MODULE_LINES, f"largest modules: {modules[:5]}"
    assert functions[0][0] <= FUNCTION_LINES, f"longest functions: {functions[:5]}"


def test_layout_matches_dvc_yaml():
    stages = yaml.safe_load((ROOT / "dvc.yaml").read_text())["stages"]
    assert stages["check"]["outs"] == [str(layout.PARAMS_CHECK)]
    assert str(layout.PARAMS_CHECK) in stages["prepare"]["deps"]  # so DVC runs check first
    assert stages["check"]["params"] == list(SECTION_STAGES)  # every section: any change to params.yaml reruns it
    assert stages["prepare"]["outs"] == [str(layout.PREPARED)]
    assert stages["train"]["outs"] == [f"{layout.MODELS}/${{item.precision}}"]
    reports = layout.ReportFiles(layout.REPORTS)
    declared = {next(iter(o)) if isinstance(o, dict) else o
                for o in stages["evaluate"]["outs"] + stages["evaluate"]["metrics"]}
    assert "plots" not in stages["evaluate"]  # a stage-level plot would draw a raw panel beside the top-level ones
    assert declared == {str(p) for p in (reports.report, reports.details, reports.figures, reports.comparison,
                                         reports.speed, reports.curves, reports.quality)}
    assert str(layout.RESUME) in (ROOT / ".gitignore").read_text()  # resume checkpoints are never DVC outputs
