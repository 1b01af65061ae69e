"""`ampbench bench` on tiny settings: it runs, and its JSON has every field."""

import json

import pytest
import torch

from ampbench.bench.cli import main
from ampbench.bench.config import BenchConfig
from ampbench.bench.loop import measure

TINY = ["--steps", "6", "--rounds", "2", "--window", "2", "--warmup-steps", "2", "--batch-size", "16",
        "--image-size", "8", "--width", "4", "--arms", "fp32,tf32,bf16"]


def test_bench_cli_writes_every_field(tmp_path, capsys, mlflow_store):
    out = tmp_path / "bench.json"
    assert main([*TINY, "--device", "cpu", "--json", str(out)]) == 0
    printed = capsys.readouterr().out
    assert "Loop overhead" in printed and "Logging:" in printed
    r = json.loads(out.read_text())
    o = r["loop_overhead"]["fp32"]
    # 2 rounds × 6 steps in windows of 2: the window ending at step 2 lies in the 2-step warm-up, 5 are kept, for
    # both loops alike (the same windows, or the ratio would compare different things).
    assert o["windows"] == [5, 5] and o["goal"] == 1.03 and f"ratio {o['ratio']:.3f}" in printed
    # Tiny rounds: the share itself is meaningless here (one SQLite commit can outlast an epoch of 6 tiny steps: a CI
    # run saw 1.31); real MLflow logging took place.
    lg = r["logging"]
    assert lg["backend"].startswith("mlflow") and lg["seconds"] > 0 and lg["train_seconds"] > 0
    arms = r["arms"]
    assert arms["fp32"]["speedup_vs_fp32"] == 1.0 and "tf32 is a CUDA tensor-core mode" in arms["tf32"]["skipped"]
    # What each arm computed in, counted: fp32 nothing in 16 bits, bf16 every matmul and convolution.
    assert arms["fp32"]["low_precision_flop_share"] == 0.0 and arms["bf16"]["low_precision_flop_share"] == 1.0
    assert arms["bf16"]["flop_dtype"] == "bfloat16" and arms["bf16"]["flops_per_sample"] > 0
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
    result = measure(cfg)  # raises on any implicit host-device sync in a steady-state step
    assert all("samples_per_s" in a or "skipped" in a for a in result["arms"].values())
    assert torch.cuda.get_sync_debug_mode() == 0


def test_bench_needs_only_torch_and_torchvision(tmp_path):
    """A GPU box often has torch and nothing else of ours: the bench must not import any other dependency."""
    import subprocess
    import sys

    from conftest import gpu_box_env

    env = gpu_box_env(tmp_path)
    proc = subprocess.run([sys.executable, "-m", "ampbench.bench", *TINY, "--device", "cpu",
                           "--json", str(tmp_path / "b.json")], env=env, capture_output=True, text=True, timeout=300)
    assert proc.returncode == 0, proc.stderr[-2000:]
    r = json.loads((tmp_path / "b.json").read_text())
    assert r["logging"]["backend"] == "json lines (mlflow not installed)"


def test_each_arms_memory_is_measured_with_only_its_own_state_alive(monkeypatch):
    """Throughput rounds interleave every arm (all alive); the memory pass then builds, measures and frees one arm
    at a time, so no other arm's model, gradients or optimizer state is in its peak."""
    import weakref

    from ampbench.bench import loop as benchloop

    live = weakref.WeakSet()
    alive_at_reset = []
    init, reset = benchloop._PipelineArm.__init__, benchloop.reset_peak_memory

    def tracked_init(self, *args, **kwargs):
        init(self, *args, **kwargs)
        live.add(self)

    def counting_reset(device):
        # No gc.collect() here: the memory pass collects before building each arm itself, and in a test process
        # with a large heap every collection costs seconds.
        alive_at_reset.append(len(live))
        reset(device)

    monkeypatch.setattr(benchloop._PipelineArm, "__init__", tracked_init)
    monkeypatch.setattr(benchloop, "reset_peak_memory", counting_reset)
    cfg = BenchConfig(device="cpu", steps=4, rounds=2, window=2, warmup_steps=1, batch_size=16, image_size=8,
                      width=4, arms=["fp32", "bf16", "fp16"], overhead_arms=["fp32"], mlflow=False)
    result = measure(cfg)
    assert max(alive_at_reset) == 3  # the interleaved throughput rounds: every arm alive
    assert alive_at_reset[-3:] == [1, 1, 1]  # the memory pass: one arm at a time
    assert all(result["arms"][a]["peak_memory_mb"] > 0 for a in cfg.arms)


def test_the_gpu_check_dry_run_on_cpu(tmp_path):
    """scripts/gpu_check.sh --device cpu: the GPU check's exact commands at tiny sizes, on the pinned torch and a
    simulated GPU machine (its packages only), so the script cannot rot between GPU slots."""
    import subprocess
    import sys

    from conftest import GPU_MACHINE_LACKS, ROOT, gpu_box_env

    out = tmp_path / "out"
    env = {**gpu_box_env(tmp_path, GPU_MACHINE_LACKS), "OUT": str(out), "PYTHON": sys.executable}
    proc = subprocess.run(["bash", str(ROOT / "scripts" / "gpu_check.sh"), "--device", "cpu"], env=env,
                          capture_output=True, text=True, timeout=600, cwd=tmp_path)
    assert proc.returncode == 0, proc.stdout[-2000:] + proc.stderr[-2000:]
    assert "sync-debug: skipped (CUDA only)" in proc.stdout
    r = json.loads((out / "gpu_bench.json").read_text())
    assert set(r["arms"]) == {"fp32", "tf32", "fp16", "bf16"} and "skipped" in r["arms"]["tf32"]
    assert all(r["arms"][a]["samples_per_s"] > 0 and r["arms"][a]["peak_memory_mb"] > 0 for a in ("fp16", "bf16"))
    assert set(r["loop_overhead"]) == {"fp32", "tf32", "fp16", "bf16"}
    assert (out / "versions.txt").read_text().startswith("torch ")
    pytest_log = (out / "gpu_pytest.txt").read_text()  # collected on the simulated machine; all skip without CUDA
    assert " skipped" in pytest_log and "error" not in pytest_log.lower()


def test_bench_times_a_language_model(tmp_path):
    """`ampbench bench --task language_model`: random byte sequences through the built-in gpt, both loops."""
    out = tmp_path / "lm.json"
    assert main(["--task", "language_model", "--block-size", "16", "--width", "16", "--steps", "4", "--rounds", "1",
                 "--window", "2", "--warmup-steps", "1", "--batch-size", "8", "--arms", "fp32,bf16", "--no-mlflow",
                 "--device", "cpu", "--json", str(out)]) == 0
    r = json.loads(out.read_text())
    assert r["config"]["model"] == "gpt" and r["loop_overhead"]["fp32"]["windows"] == [1, 1]
    assert r["arms"]["fp32"]["low_precision_flop_share"] == 0.0 and r["arms"]["bf16"]["low_precision_flop_share"] == 1.0
