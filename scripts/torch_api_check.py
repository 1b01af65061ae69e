"""Does the installed torch / torchvision have every attribute the pipeline's code names?

Reads ``src/ampbench`` and ``pipeline/`` with ``ast`` (nothing of ours is imported), collects every dotted name rooted
at ``torch`` or ``torchvision`` — ``torch.amp.GradScaler``, ``F.cross_entropy`` through ``import torch.nn.functional
as F``, ``nn.Module`` through ``from torch import nn``, ``from torch.utils.flop_counter import FlopCounterMode`` —
and resolves each in the installed packages (import the longest importable module prefix, then ``getattr`` down).
Prints one line per name and, last, the missing ones; exits 1 if any is missing. Names reached through a variable
(``model.to(...)``) are method calls on our objects, not checked here: the tests cover them.

  python scripts/torch_api_check.py            # the torch on PATH's python
  python scripts/torch_api_check.py --json F   # also write {torch, torchvision, checked: [...], missing: [...]}

Calls the pipeline guards with ``getattr(..., None)`` / ``hasattr`` (a fallback it records) are reported as
``guarded`` rather than missing: the code already copes without them.
"""

from __future__ import annotations

import argparse
import ast
import importlib
import json
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
SOURCES = [ROOT / "src" / "ampbench", ROOT / "pipeline"]
ROOTS = ("torch", "torchvision")


def _dotted(node: ast.AST) -> list[str] | None:
    parts = []
    while isinstance(node, ast.Attribute):
        parts.append(node.attr)
        node = node.value
    if isinstance(node, ast.Name):
        return [node.id, *reversed(parts)]
    return None


def _guarded_names(tree: ast.AST, aliases: dict[str, str]) -> set[str]:
    """``hasattr(torch.x, "y")`` / ``getattr(torch.x, "y", default)``: names the code checks before use."""
    out = set()
    for node in ast.walk(tree):
        if (isinstance(node, ast.Call) and isinstance(node.func, ast.Name) and node.func.id in ("hasattr", "getattr")
                and len(node.args) >= 2 and isinstance(node.args[1], ast.Constant)
                and isinstance(node.args[1].value, str)):
            base = _dotted(node.args[0])
            if base and base[0] in aliases:
                out.add(".".join([aliases[base[0]], *base[1:], node.args[1].value]))
    return out


def names_in(path: Path) -> tuple[set[str], set[str]]:
    """(every torch/torchvision dotted name ``path`` uses, those it only uses behind hasattr/getattr)."""
    tree = ast.parse(path.read_text(), filename=str(path))
    aliases: dict[str, str] = {}  # local name -> the dotted name it stands for
    used: set[str] = set()
    for node in ast.walk(tree):
        if isinstance(node, ast.Import):
            for a in node.names:
                if a.name.split(".")[0] in ROOTS:
                    aliases[a.asname or a.name.split(".")[0]] = a.name if a.asname else a.name.split(".")[0]
                    used.add(a.name)
        elif isinstance(node, ast.ImportFrom) and node.module and node.module.split(".")[0] in ROOTS:
            for a in node.names:
                aliases[a.asname or a.name] = f"{node.module}.{a.name}"
                used.add(f"{node.module}.{a.name}")
    for node in ast.walk(tree):
        if isinstance(node, ast.Attribute):
            parts = _dotted(node)
            if parts and parts[0] in aliases:
                used.add(".".join([aliases[parts[0]], *parts[1:]]))
    # keep only the longest chains: torch.amp.GradScaler implies torch.amp
    longest = {n for n in used if not any(m.startswith(n + ".") for m in used)}
    return longest, _guarded_names(tree, aliases)


def resolve(name: str) -> bool:
    parts = name.split(".")
    obj = None
    for i in range(len(parts), 0, -1):  # the longest importable module prefix
        try:
            obj = importlib.import_module(".".join(parts[:i]))
        except ImportError:
            continue
        rest = parts[i:]
        break
    else:
        return False
    for attr in rest:
        if not hasattr(obj, attr):
            return False
        obj = getattr(obj, attr)
    return True


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--json", type=Path, help="also write the result as JSON here")
    args = p.parse_args(argv)
    import torch
    import torchvision

    used: dict[str, set[str]] = {}
    guarded: set[str] = set()
    for src in SOURCES:
        for path in sorted(src.rglob("*.py")):
            names, g = names_in(path)
            guarded |= g
            for n in names:
                used.setdefault(n, set()).add(str(path.relative_to(ROOT)))
    missing, optional = [], []
    print(f"torch {torch.__version__}, torchvision {torchvision.__version__}: {len(used)} names used by the pipeline")
    for name in sorted(used):
        ok = resolve(name)
        state = "ok" if ok else ("guarded (missing; the code falls back)" if name in guarded else "MISSING")
        if not ok:
            (optional if name in guarded else missing).append(name)
        print(f"  {state:8s} {name}  ({', '.join(sorted(used[name]))})")
    for name in sorted(guarded - set(used)):
        if not resolve(name):
            optional.append(name)
            print(f"  guarded  {name}: absent here; the code checks for it and falls back")
    print(f"missing: {', '.join(missing) if missing else 'none'}")
    if args.json:
        args.json.write_text(json.dumps({"torch": torch.__version__, "torchvision": torchvision.__version__,
                                         "checked": sorted(used), "missing": missing,
                                         "guarded_absent": sorted(optional)}, indent=2) + "\n")
    return 1 if missing else 0


if __name__ == "__main__":
    sys.exit(main())
