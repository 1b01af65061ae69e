"""`ampbench bench` on tiny settings: it runs, and its JSON has every field."""

import json

import pytest
import torch

from ampbench.bench import BenchConfig, main, run

TINY = ["--steps", "6", "--rounds", "2", "--window", "2", "--warmup-steps", "2", "--batch-size", "16",
        "--image-size", "8", "--width", "4", "--arms", "fp32,tf32,bf16"]


def test_bench_cli_writes_every_field(tmp_path, capsys, mlflow_store):
    out = tmp_path / "bench.json"
    assert main([*TINY, "--device", "cpu", "--json", str(out)]) == 0
    printed = capsys.readouterr().out
    assert "Loop overhead" in printed and "Logging:" in printed
    r = json.loads(out.read_text())
    o = r["loop_overhead"]["fp32"]
    for key in ("bare_samples_per_s", "pipeline_samples_per_s", "ratio", "goal", "meets_goal", "windows"):
        assert key in o
    assert o["ratio"] > 0 and o["windows"][0] > 0 and o["windows"][1] > 0
    lg = r["logging"]  # tiny rounds: the share itself is meaningless here; real MLflow logging took place
    assert lg["backend"].startswith("mlflow") and lg["seconds"] > 0 and 0 < lg["share"] < 1
    assert r["arms"]["fp32"]["speedup_vs_fp32"] == 1.0
    assert "speedup_vs_fp32" in r["arms"]["bf16"] and "skipped" in r["arms"]["tf32"]
    assert r["fingerprint"]["device_type"] == "cpu"


@pytest.mark.skipif(torch.cuda.is_available(), reason="needs a machine without CUDA")
def test_bench_errors_exit_non_zero(tmp_path, capsys):
    code = main([*TINY, "--device", "cuda", "--json", str(tmp_path / "x")])
    assert code == 1 and "no CUDA device" in capsys.readouterr().err
    assert not (tmp_path / "x").exists()


def test_bench_rejects_nonsense_sizes(tmp_path):
    with pytest.raises(SystemExit) as exc:
        main([*TINY, "--image-size", "0", "--json", str(tmp_path / "x")])
    assert exc.value.code == 2


@pytest.mark.gpu
def test_steady_state_steps_never_sync_on_gpu(tmp_path):
    """Every arm's steady-state step under torch.cuda.set_sync_debug_mode('error')."""
    cfg = BenchConfig(device="cuda", steps=12, rounds=1, window=4, warmup_steps=2, sync_debug=True,
                      arms=["fp32", "tf32", "fp16", "bf16"], overhead_arms=["fp16"], mlflow=False)
    result = run(cfg)  # raises on any implicit host-device sync in a steady-state step
    assert all("samples_per_s" in a or "skipped" in a for a in result["arms"].values())
    assert torch.cuda.get_sync_debug_mode() == 0


def test_bench_needs_only_torch_and_torchvision(tmp_path):
    """A GPU box often has torch and nothing else of ours: the bench must not import any other dependency."""
    import subprocess
    import sys

    from conftest import ROOT

    blocker = tmp_path / "sitecustomize.py"
    # Importing a blocked package fails as if it were absent; a mere probe (torch probes optional packages
    # with importlib.util.find_spec) still succeeds, so only real imports are caught.
    blocker.write_text(
        "import importlib.abc, importlib.machinery, sys\n"
        "BLOCKED = {'mlflow', 'dvc', 'pydantic', 'click', 'tqdm', 'yaml', 'sklearn', 'matplotlib', 'scipy',\n"
        "           'pytest'}\n"
        "class _Absent(importlib.abc.Loader):\n"
        "    def create_module(self, spec):\n"
        "        return None\n"
        "    def exec_module(self, module):\n"
        "        raise ImportError(f'{module.__name__} is not installed on this (simulated) GPU box')\n"
        "class _Block:\n"
        "    def find_spec(self, name, path=None, target=None):\n"
        "        if name.split('.')[0] in BLOCKED:\n"
        "            return importlib.machinery.ModuleSpec(name, _Absent())\n"
        "sys.meta_path.insert(0, _Block())\n")
    env = {"PYTHONPATH": f"{tmp_path}:{ROOT / 'src'}", "PATH": "/usr/bin:/bin"}
    proc = subprocess.run([sys.executable, "-m", "ampbench.bench", *TINY, "--device", "cpu",
                           "--json", str(tmp_path / "b.json")], env=env, capture_output=True, text=True, timeout=300)
    assert proc.returncode == 0, proc.stderr[-2000:]
    r = json.loads((tmp_path / "b.json").read_text())
    assert r["logging"]["backend"] == "json lines (mlflow not installed)"
