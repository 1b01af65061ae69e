"""What one GPU slot runs, checked on CPU so it cannot rot between slots: the wheel set the GPU machine lacks
(scripts/gpu_wheels.*), the torch API check, the profiles, and `gpu_check.sh --pipeline --device cpu` on a
simulated GPU machine."""

import json
import sqlite3
import subprocess
import sys
import tarfile
import zipfile

import pytest

from conftest import ROOT

sys.path.insert(0, str(ROOT / "scripts"))
import gpu_profile  # noqa: E402
import gpu_wheels  # noqa: E402
import torch_api_check  # noqa: E402


def _lock() -> dict[str, str]:
    from packaging.utils import canonicalize_name

    pins = {}
    for line in (ROOT / "requirements.lock").read_text().splitlines():
        if "==" in line and not line.startswith("#"):
            name, version = line.split("==")
            pins[canonicalize_name(name)] = version
    return pins


def test_the_wheel_plan_is_what_the_image_lacks_at_the_locked_versions():
    plan, image, lock = gpu_wheels.plan(), gpu_wheels.image_packages(), _lock()
    # The pipeline's own needs, the SQLite store's and what `import mlflow` needs (found by the simulated view).
    for name in ("dvc", "mlflow-skinny", "sqlalchemy", "alembic", "pydantic-core", "databricks-sdk", "fastapi"):
        assert name in plan
    # Never carried: what the image has (torch above all), the full mlflow and its server.
    for name in ("torch", "torchvision", "numpy", "scikit-learn", "mlflow", "flask", "gunicorn", "uvicorn"):
        assert name not in plan
    assert not (set(plan) & set(image)) - set(gpu_wheels.CARRY_ANYWAY)
    assert all(plan[name] == lock[name] for name in plan), {n: (plan[n], lock.get(n)) for n in plan
                                                             if plan[n] != lock.get(n)}


def _fake_wheel(folder, filename, name, version, requires=()):
    with zipfile.ZipFile(folder / filename, "w") as z:
        dist = f"{name.replace('-', '_')}-{version}.dist-info"
        z.writestr(f"{dist}/METADATA", "\n".join(["Metadata-Version: 2.1", f"Name: {name}", f"Version: {version}",
                                                 *(f"Requires-Dist: {r}" for r in requires)]) + "\n\nbody\n")


def test_the_wheel_check_names_each_kind_of_problem(tmp_path):
    _fake_wheel(tmp_path, "alpha-1.0-py3-none-any.whl", "alpha", "1.0", ["beta>=2", "numpy<2"])
    _fake_wheel(tmp_path, "beta-1.5-py3-none-any.whl", "beta", "1.5")
    _fake_wheel(tmp_path, "gamma-1.0-cp311-cp311-manylinux_2_17_x86_64.whl", "gamma", "1.0",
                ['nowhere; python_version < "3.12"', "missing-thing"])
    _fake_wheel(tmp_path, "gamma-2.0-py3-none-any.whl", "gamma", "2.0")
    problems = "\n".join(gpu_wheels.check(tmp_path))
    assert "alpha 1.0 needs beta>=2; the wheel is 1.5" in problems
    assert "alpha 1.0 needs numpy<2; the image has 2.5.2: carry a wheel of it" in problems
    assert "gamma-1.0-cp311-cp311-manylinux_2_17_x86_64.whl: no tag CPython 3.12" in problems
    assert "gamma: two versions" in problems
    assert "gamma 1.0 needs missing-thing: neither a wheel here nor in the image" in problems
    assert "nowhere" not in problems  # a marker for another Python is not a requirement there
    assert "the project needs dvc" in problems  # the project's own requirements are checked too


def test_the_simulated_gpu_machine_imports_only_what_it_will_have(tmp_path):
    python = gpu_wheels.simulate(tmp_path / "view")
    code = ("import importlib.util as u, sys\n"
            "import mlflow, mlflow.pytorch, pydantic\n"  # (the dry run below imports dvc, torch and the rest)
            "for m in ('flask', 'gunicorn', 'uvicorn', 'ruff', 'psycopg2'):\n"
            "    try:\n"
            "        __import__(m)\n"
            "    except ImportError:\n"
            "        continue\n"
            "    sys.exit(f'{m} importable')\n")
    proc = subprocess.run([str(python), "-c", code], capture_output=True, text=True, timeout=180)
    assert proc.returncode == 0, proc.stderr[-2000:] + proc.stdout


def test_the_torch_api_check_resolves_names_and_reports_absent_ones(tmp_path, capsys):
    src = tmp_path / "m.py"
    src.write_text("import torch\nimport torch.nn.functional as F\nfrom torch import nn\n"
                   "from torch.utils.flop_counter import FlopCounterMode\n"
                   "x = F.cross_entropy\ny = nn.Module\nz = torch.amp.GradScaler\nw = torch.no_such_thing\n"
                   "if hasattr(torch.cuda, 'maybe_later'):\n    pass\n")
    used, guarded = torch_api_check.names_in(src)
    assert {"torch.nn.functional.cross_entropy", "torch.nn.Module", "torch.amp.GradScaler",
            "torch.utils.flop_counter.FlopCounterMode", "torch.no_such_thing"} <= used
    assert guarded == {"torch.cuda.maybe_later"}
    assert torch_api_check.resolve("torch.amp.GradScaler") and not torch_api_check.resolve("torch.no_such_thing")
    assert torch_api_check.main(["--json", str(tmp_path / "api.json")]) == 0  # the pipeline's own code, this torch
    r = json.loads((tmp_path / "api.json").read_text())
    assert len(r["checked"]) > 100 and r["missing"] == [] and "torch.amp.GradScaler" in r["checked"]


@pytest.mark.parametrize("profile,device", sorted(gpu_profile.PROFILES))
def test_every_gpu_profile_is_a_valid_params_file_in_a_lean_copy(tmp_path, profile, device):
    from ampbench.config.validation import load_params

    dest = tmp_path / "copy"
    assert gpu_profile.main(profile, device, str(ROOT), str(dest)) == 0
    p = load_params(dest / "params.yaml")
    assert p.train.device == device and {"fp32", "bf16"} <= set(p.train.precisions)
    if device == "cuda":  # the GPU slot measures every main arm
        assert p.train.precisions == ["fp32", "tf32", "fp16", "bf16"] and len(p.train.seeds) >= 2
    assert not any((dest / n).exists() for n in (".git", ".venv", ".whl", "mlflow.db", "models", ".dvc/cache"))
    assert (dest / "dvc.yaml").is_file() and (dest / "src" / "ampbench" / "training" / "loop.py").is_file()


@pytest.mark.slow
@pytest.mark.gpu_slot
def test_the_pipeline_gpu_check_dry_run_on_cpu(tmp_path):
    """`gpu_check.sh --pipeline --device cpu`: the GPU slot's exact command at tiny sizes on a simulated GPU machine
    (what its image has plus the wheel set, nothing else): API check, bench, pytest -m gpu, then a real `dvc repro`
    without git, logging to one SQLite store, and the packing. The digits profile only, to keep the suite's time;
    the resnet18 profile's params are checked above and it runs through the same loop of the script."""
    out = tmp_path / "out"
    env = {"PATH": f"{ROOT / '.venv' / 'bin'}:/usr/bin:/bin", "HOME": str(tmp_path), "OUT": str(out),
           "PYTHON": sys.executable, "GPU_CHECK_PROFILES": "digits", "AMPBENCH_SOURCE": "test"}
    proc = subprocess.run(["bash", str(ROOT / "scripts" / "gpu_check.sh"), "--pipeline", "--device", "cpu"],
                          env=env, capture_output=True, text=True, timeout=600, cwd=tmp_path)
    assert proc.returncode == 0, proc.stdout[-4000:] + proc.stderr[-2000:]
    assert "simulated GPU machine" in proc.stdout and "DVC runs without git here" in proc.stdout
    assert "== gpu_check: every step passed" in proc.stdout and "sync-debug: skipped (CUDA only)" in proc.stdout
    versions = (out / "versions.txt").read_text()
    assert versions.startswith("torch ") and "source test" in versions and "missing: none" in versions
    r = json.loads((out / "gpu_bench.json").read_text())
    assert set(r["loop_overhead"]) == {"fp32", "tf32", "fp16", "bf16"} and "skipped" in r["arms"]["tf32"]
    assert " skipped" in (out / "gpu_pytest.txt").read_text()
    with tarfile.open(out / "pipeline_digits.tar.gz") as tar:
        names = set(tar.getnames())
        comparison = json.load(tar.extractfile("reports/comparison.json"))
    assert {"params.yaml", "dvc.lock", "reports/report.md", "reports/speed.json", "models/fp32/summary.json"} <= names
    assert set(comparison) == {"fp32", "bf16"} and comparison["bf16"]["verdict"]
    with sqlite3.connect(out / "mlflow.db") as db:
        finished = db.execute("select count(*) from runs where status = 'FINISHED'").fetchone()[0]
    assert finished >= 2 * 2  # fp32, bf16 × 2 seeds, parents aside


@pytest.mark.slow
@pytest.mark.gpu_slot
def test_the_new_arms_gpu_check_dry_run_on_cpu(tmp_path):
    """`gpu_check.sh --new-arms --device cpu`: the second GPU command (the arms past autocast benched side by side,
    their GPU test) on the simulated GPU machine, which has torchao and torch-optimi only from the wheel set."""
    out = tmp_path / "out"
    env = {"PATH": f"{ROOT / '.venv' / 'bin'}:/usr/bin:/bin", "HOME": str(tmp_path), "OUT": str(out),
           "PYTHON": sys.executable, "AMPBENCH_SOURCE": "test"}
    proc = subprocess.run(["bash", str(ROOT / "scripts" / "gpu_check.sh"), "--new-arms", "--device", "cpu"],
                          env=env, capture_output=True, text=True, timeout=600, cwd=tmp_path)
    assert proc.returncode == 0, proc.stdout[-4000:] + proc.stderr[-2000:]
    assert "== gpu_check --new-arms: every step passed" in proc.stdout
    new = json.loads((out / "gpu_bench_new_arms.json").read_text())["arms"]
    assert {"fp32", "bf16_pure", "bf16_sr", "bf16_kahan", "fp8_tensorwise", "fp8_rowwise"} <= set(new)
    assert all(new[a].get("samples_per_s") and new[a].get("state_bytes_per_parameter") for a in new)
    assert new["bf16_sr"]["state_bytes_per_parameter"] < new["fp32"]["state_bytes_per_parameter"]
    assert " skipped" in (out / "gpu_pytest_new_arms.txt").read_text()  # the GPU test, on a CPU
