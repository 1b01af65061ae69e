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
    # Under the default time budget: round 0 of 2 + 2 steps (warm-up and one window: 1 window kept), then 2 rounds
    # × 6 steps in windows of 2 (3 each): 7, for both loops alike (the same windows, or the ratio would compare
    # different things).
    assert o["windows"] == [7, 7] and o["goal"] == 1.03 and f"ratio {o['ratio']:.3f}" in printed
    assert o["steps_measured"] == 16 and o["rounds_run"] == 3 and not o["cut_short"] and "cut short" not in printed
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


def test_bench_times_a_language_model(tmp_path):
    """`ampbench bench --task language_model`: random byte sequences through the built-in gpt, both loops."""
    out = tmp_path / "lm.json"
    assert main(["--task", "language_model", "--block-size", "16", "--width", "16", "--steps", "4", "--rounds", "1",
                 "--window", "2", "--warmup-steps", "1", "--batch-size", "8", "--arms", "fp32,bf16", "--no-mlflow",
                 "--device", "cpu", "--json", str(out)]) == 0
    r = json.loads(out.read_text())
    # The untimed first step (the budget's), then round 0: the warm-up step rounded up to a window, and one window
    # (4 steps; both windows start past the untimed step and the warm-up, so both are kept); round 1: 4 steps, 2.
    assert r["config"]["model"] == "gpt" and r["loop_overhead"]["fp32"]["windows"] == [4, 4]
    assert r["arms"]["fp32"]["low_precision_flop_share"] == 0.0 and r["arms"]["bf16"]["low_precision_flop_share"] == 1.0


def _budgeted_rounds(monkeypatch, seconds_per_step: float, budget: float | None) -> tuple[list[int], dict]:
    """The steps of each round ``Budget`` lets an arm run at a fixed cost per step (a fake clock)."""
    from types import SimpleNamespace

    from ampbench.speed import budget as benchbudget

    clock = [0.0]
    monkeypatch.setattr(benchbudget, "time", SimpleNamespace(perf_counter=lambda: clock[0]))
    cfg = BenchConfig(steps=30, rounds=5, window=10, warmup_steps=10, arm_budget=budget)
    b, ran = benchbudget.Budget(cfg, budget), []

    def one_round(steps: int) -> None:
        ran.append(steps)
        clock[0] += steps * seconds_per_step

    for r in range(b.total_rounds):
        steps = b.steps_for(r)
        if not steps:
            break
        b.run(steps, one_round)
    return ran, b.record()


def test_a_slow_arm_is_cut_to_its_time_budget(monkeypatch):
    # 0.5 s per step, 20 s: round 0 (warm-up + one window, 10 s) always; then one window per round while it fits.
    ran, rec = _budgeted_rounds(monkeypatch, 0.5, 20.0)
    assert ran == [20, 10, 10] and rec == {"budget_s": 20.0, "steps_measured": 40, "rounds_run": 3,
                                           "cut_short": True}
    # Slower than the budget allows even for round 0: round 0 still runs (the least that measures anything).
    ran, rec = _budgeted_rounds(monkeypatch, 5.0, 20.0)
    assert ran == [20] and rec["cut_short"]


def test_a_fast_arm_and_an_unbudgeted_one_run_every_round_in_full(monkeypatch):
    ran, rec = _budgeted_rounds(monkeypatch, 0.01, 20.0)
    assert ran == [20, 30, 30, 30, 30, 30] and not rec["cut_short"]
    ran, rec = _budgeted_rounds(monkeypatch, 5.0, None)  # the GPU profile: as before, whatever it costs
    assert ran == [30] * 5 and not rec["cut_short"]


def test_under_a_budget_each_arm_first_takes_one_step_outside_it():
    # The first step compiles (--compile, torchao's optimizer); round 0 would otherwise charge it to the budget and
    # size every later round from it. The step is taken and its time and windows are thrown away.
    from ampbench.bench.loop import _BareArm, _data, _PipelineArm
    from ampbench.speed.budget import prime

    cfg = BenchConfig(device="cpu", steps=6, rounds=1, window=1, warmup_steps=0, batch_size=16, image_size=8,
                      width=4, mlflow=False)
    device, logged = torch.device("cpu"), []
    train, val = _data(cfg, 96, device, 0), _data(cfg, 16, device, 1)
    pipe = _PipelineArm(cfg, "fp32", device, train, val, lambda row, steps: logged.append(row))
    bare = _BareArm(cfg, "fp32", device, train)
    prime(cfg, [pipe, bare])  # windows of one step, no warm-up: a measured step would have kept one
    assert (pipe.state.step, pipe.windows, pipe.seconds, pipe.logging_seconds, logged) == (1, [], 0.0, 0.0, [])
    assert (bare.steps, bare.windows) == (1, [])
    prime(BenchConfig(device="cpu", arm_budget=None), [pipe, bare])  # no budget: the warm-up absorbs it, as before
    assert (pipe.state.step, bare.steps) == (1, 1)
    pipe.round(1), bare.round(1)
    assert len(pipe.windows) == len(bare.windows) == 1 and pipe.seconds > 0 and len(logged) == 1


def test_round_0_keeps_a_window_even_when_the_window_is_longer_than_the_warm_up(tmp_path, capsys):
    from ampbench.bench.config import first_round_steps

    assert [first_round_steps(w, n) for w, n in ((10, 10), (2, 2), (1, 2), (2, 5), (0, 5), (11, 10))] == \
        [20, 4, 4, 10, 5, 30]
    # Warm-up 2, windows of 5, a budget only round 0 fits: warm-up + one window (7 steps) kept no window at all,
    # and the speed ratio divided None (a TypeError ended the bench).
    out = tmp_path / "b.json"
    args = [*TINY[:-1], "fp32,bf16", "--steps", "10", "--window", "5"]
    assert main([*args, "--device", "cpu", "--no-mlflow", "--arm-budget", "0.000001", "--json", str(out)]) == 0
    r = json.loads(out.read_text())
    for arm in ("fp32", "bf16"):
        assert r["arms"][arm]["steps_measured"] == 10 and r["arms"][arm]["samples_per_s"] > 0
    assert "cut short by its 1e-06 s budget: 10 steps in 1 round, not 10 + 2 × 10" in capsys.readouterr().out


def test_the_table_says_which_arm_was_cut_short(tmp_path, capsys):
    out = tmp_path / "b.json"
    tiny = [*TINY[:-1], "fp32,bf16"]
    assert main([*tiny, "--device", "cpu", "--no-mlflow", "--arm-budget", "0.000001", "--json", str(out)]) == 0
    printed = capsys.readouterr().out
    r = json.loads(out.read_text())
    for arm in ("fp32", "bf16"):  # round 0 only: 2 warm-up steps + one window of 2
        assert r["arms"][arm]["cut_short"] and r["arms"][arm]["steps_measured"] == 4
        assert f"{arm} (throughput): cut short by its 1e-06 s budget: 4 steps in 1 round," in printed
    with pytest.raises(SystemExit):
        main([*TINY, "--arm-budget", "0", "--json", str(out)])
