"""Where a run's results come from: the hash of the code that trained them and the git/DVC revision tags.

The stage commands (pipeline/_common.py) and ``ampbench cluster repro`` compute the same values, so a cluster's
cells and the train stages that collect them agree on the resume key and on the execution's parent run.
"""

from __future__ import annotations

import hashlib
import os
import subprocess
from pathlib import Path
from typing import Mapping


def code_version(checkout: Path, *user_code: str) -> str:
    """Hash of the library's source and of the user code (train.model_code, train.task_code: files or folders,
    relative to ``checkout`` as in dvc.yaml): a checkpoint written by other code is not resumed."""
    files = [*(checkout / "src" / "ampbench").rglob("*.py")]
    for code in (checkout / c for c in user_code):  # an absolute path stays absolute
        files += [code] if code.is_file() else code.rglob("*")
    h = hashlib.sha256()
    for path in sorted(p for p in files if p.is_file() and "__pycache__" not in p.parts):
        h.update(path.read_bytes())
    return h.hexdigest()[:16]


def run_tags(checkout: Path, environ: Mapping[str, str] = os.environ) -> dict[str, str]:
    """Provenance tags for MLflow: git commit, and the DVC experiment's name and baseline revision (the commit it
    started from; the commit itself under a plain `dvc repro`), which DVC passes to experiment stages."""
    try:
        commit = subprocess.run(["git", "rev-parse", "HEAD"], capture_output=True, text=True, check=True,
                                cwd=checkout).stdout.strip()
    except (OSError, subprocess.CalledProcessError):  # a cluster cell's copy has no .git: the head says which
        commit = environ.get("AMPBENCH_GIT_COMMIT") or "unknown"
    tags = {"git_commit": commit, "mlflow.source.git.commit": commit,
            "dvc.baseline_rev": environ.get("DVC_EXP_BASELINE_REV") or commit}
    if environ.get("DVC_EXP_NAME"):
        tags["dvc.exp_name"] = environ["DVC_EXP_NAME"]
    return tags
