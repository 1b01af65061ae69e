"""A copy of the project with a GPU check profile's params, for ``scripts/gpu_check.sh --pipeline`` to `dvc repro`.

  python scripts/gpu_profile.py PROFILE DEVICE SOURCE DEST

PROFILE: ``resnet18`` (the built-in ResNet-18 on synthetic 32×32 images, channels_last, batch 256: convolutions
where tensor cores matter, sized to train each arm and seed in seconds on an H100-class GPU; no model logged, 45 MB
per run) or ``digits`` (the defaults on scikit-learn's digits: the run whose verdicts mean something). DEVICE
``cpu`` shrinks either to a dry run of a few seconds per arm. The copy leaves out what never travels to the GPU
machine (git, virtual environments, the DVC cache, the MLflow store, pipeline outputs), so a dry run here copies
what the GPU machine has.
"""

from __future__ import annotations

import shutil
import sys
from pathlib import Path

import yaml

SKIP_ANYWHERE = {".git", ".venv", ".whl", "__pycache__", ".pytest_cache", "site", "mlartifacts", "mlruns",
                 "dvc_plots", ".resume", ".team"}
SKIP_AT_ROOT = {"models", "mlflow.db", "mlflow.db.lock", ".gl"}
SKIP_NESTED = {("data", "prepared"), (".dvc", "cache"), (".dvc", "tmp"), ("reports", "figures")}

ARMS = ["fp32", "tf32", "fp16", "bf16"]
# A dry run's speed stage: a few timed steps, not the default's 10 s per arm (timings mean nothing on a CPU here).
DRY_SPEED = {"rounds": 2, "steps": 6, "window": 3, "warmup_steps": 2, "seconds_per_arm": 2.0}
PROFILES = {
    ("resnet18", "cuda"): {
        "prepare": {"dataset": "synthetic", "synthetic": {"image_size": 32, "channels": 3, "classes": 10,
                                                          "count": 24576, "noise": 1.0}},
        "train": {"precisions": ARMS, "seeds": [0, 1], "device": "cuda", "model": "resnet18", "epochs": 3,
                  "batch_size": 256, "channels_last": True},
        "mlflow": {"log_model": False},
    },
    ("resnet18", "cpu"): {
        "prepare": {"dataset": "synthetic", "synthetic": {"image_size": 8, "channels": 3, "classes": 4,
                                                          "count": 192, "noise": 1.0}},
        "train": {"precisions": ARMS, "seeds": [0, 1], "device": "cpu", "model": "resnet18", "width": 4,
                  "epochs": 1, "batch_size": 32, "channels_last": True},
        "speed": DRY_SPEED,
        "mlflow": {"log_model": False},
    },
    ("digits", "cuda"): {"train": {"device": "cuda"}},
    ("digits", "cpu"): {  # two arms: the test suite runs this one (the resnet18 profile keeps all four)
        "prepare": {"max_train": 160, "max_test": 96},
        "train": {"precisions": ["fp32", "bf16"], "seeds": [0, 1], "device": "cpu", "epochs": 1,
                  "width": 4},
        "speed": DRY_SPEED,
    },
}


def _ignore(root: Path):
    def ignore(folder: str, names: list[str]) -> set[str]:
        rel = Path(folder).resolve().relative_to(root).parts
        skip = {n for n in names if n in SKIP_ANYWHERE}
        if not rel:
            skip |= {n for n in names if n in SKIP_AT_ROOT or n.startswith("mlflow.db")}
        skip |= {n for n in names if (*rel, n) in SKIP_NESTED}
        return skip
    return ignore


def _merge(base: dict, over: dict) -> dict:
    for key, value in over.items():
        base[key] = _merge(base.get(key) or {}, value) if isinstance(value, dict) else value
    return base


def main(profile: str, device: str, source: str, dest: str) -> int:
    if (profile, device) not in PROFILES:
        print(f"error: no profile {profile!r} for device {device!r} (have: "
              f"{', '.join(sorted({p for p, _ in PROFILES}))}; device cuda or cpu)", file=sys.stderr)
        return 2
    src, dst = Path(source).resolve(), Path(dest)
    shutil.copytree(src, dst, ignore=_ignore(src), symlinks=True)
    params_path = dst / "params.yaml"
    params = _merge(yaml.safe_load(params_path.read_text()), PROFILES[profile, device])
    params["train"]["progress"] = False  # a log, not a terminal
    params_path.write_text(yaml.safe_dump(params, sort_keys=False))
    changed = PROFILES[profile, device]
    print(f"profile {profile} on {device}: {dst} with " +
          "; ".join(f"{section}.{k}={v}" for section, keys in changed.items() for k, v in keys.items()))
    return 0


if __name__ == "__main__":
    if len(sys.argv) != 5:
        print(__doc__.strip().splitlines()[2].strip(), file=sys.stderr)
        sys.exit(2)
    sys.exit(main(*sys.argv[1:]))
