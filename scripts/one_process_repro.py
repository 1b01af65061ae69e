"""The pipeline's stages run one after another in one Python process: the reference against which the cost of
running each DVC stage in its own process (imports, MLflow store set-up, ~8 s a stage on a 2-core EPYC) is
measured (issue 39). It runs exactly the commands of dvc.yaml — check, prepare, every train@<arm>, speed, evaluate —
through their click entry points, with the same params, outputs and MLflow logging, but imports torch, MLflow and
the library once. It writes the workspace's outputs without DVC: run it in a scratch clone, then compare with

    /usr/bin/time -f %e .venv/bin/dvc repro --force        # one process per stage
    /usr/bin/time -f %e .venv/bin/python scripts/one_process_repro.py

BENCHMARKS.md has the figures. Not for everyday use: DVC records nothing of this run.
"""

from __future__ import annotations

import importlib.util
import sys
import time
from pathlib import Path

import yaml

ROOT = Path(__file__).resolve().parents[1]


def stage(name: str):
    """pipeline/<name>.py's click command, imported by path (every stage file names its command ``main``)."""
    spec = importlib.util.spec_from_file_location(f"stage_{name}", ROOT / "pipeline" / f"{name}.py")
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module.main


def main() -> int:
    sys.path.insert(0, str(ROOT / "pipeline"))  # the stages import their shared _common
    arms = yaml.safe_load((ROOT / "params.yaml").read_text())["train"]["precisions"]
    commands = [("check", []), ("prepare", [])] + [("train", ["--precision", a]) for a in arms]
    commands += [("speed", []), ("evaluate", [])]
    for name, args in commands:
        started = time.perf_counter()
        stage(name).main(args, standalone_mode=False)
        print(f"[one process] {name} {' '.join(args)}: {time.perf_counter() - started:.1f} s", file=sys.stderr)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
