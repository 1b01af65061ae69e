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
    # Under the default time budget: two steps first, round 0 (2 warm-up steps + two windows of 2), then 2 measured
    # rounds × 6 steps in windows of 2 (3 each; a round's first is not counted), and rounds more while the
    # overhead's verdict or the logging share's is undecided, up to 4 × 2: both loops alike, through the speed
    # harness, so the ratio compares the same things.
    n = o["rounds"][0]
    assert o["rounds"] == [n, n] and 2 <= n <= 8 and o["goal"] == 1.03 and f"ratio {o['ratio']:.3f}" in printed
    low, high = o["ratio_ci"]
    assert low <= o["ratio"] <= high and f"[{low:.3f}, {high:.3f}]" in printed
    lg = r["logging"]
    assert n == 8 or "undecided" not in (o["verdict"], lg["verdict"])  # more rounds stop only once both decide
    assert o["verdict"] in ("within", "above", "undecided") and f"(goal ≤ 1.03): {o['verdict_text']}" in printed
    for loop in ("bare", "pipeline"):
        rec = o["budgets"][loop]
        assert rec["phases"]["first call"]["steps"] == 2 and rec["warmup_steps_run"] == 6
        assert rec["round_steps"] == [6] * n and rec["more_rounds"] == n - 2 and not rec["cut_short"]
        assert rec["seconds"] == pytest.approx(sum(p["seconds"] for p in rec["phases"].values()), abs=0.01)
    assert "cut by" not in printed
    # Tiny rounds: the share itself is meaningless here (one SQLite commit can outlast an epoch of 6 tiny steps: a CI
    # run saw 1.31); real MLflow logging took place, an epoch of each measured round.
    assert lg["backend"].startswith("mlflow") and lg["seconds"] > 0 and lg["train_seconds"] > 0
    assert lg["epochs"] == n and lg["verdict"] in ("within", "above", "undecided") and "Logging: " in printed
    arms = r["arms"]
    assert arms["fp32"]["speedup_vs_fp32"] == 1.0 and "tf32 is a CUDA tensor-core mode" in arms["tf32"]["skipped"]
    low, high = arms["bf16"]["speedup_vs_fp32_ci"]  # the median of per-round ratios, with its interval
    assert low <= arms["bf16"]["speedup_vs_fp32"] <= high and len(arms["bf16"]["ratios"]) == 2
    # What each arm computed in, counted: fp32 nothing in 16 bits, bf16 every matmul and convolution.
    assert arms["fp32"]["low_precision_flop_share"] == 0.0 and arms["bf16"]["low_precision_flop_share"] == 1.0
    assert arms["bf16"]["flop_dtype"] == "bfloat16" and arms["bf16"]["flops_per_sample"] > 0
    assert r["fingerprint"]["device_type"] == "cpu"


@pytest.mark.skipif(torch.cuda.is_available(), reason="needs a machine without CUDA")
def test_bench_errors_exit_non_zero(tmp_path, capsys):
    code = main([*TINY, "--device", "cuda", "--json", str(tmp_path / "x")])
    assert code == 1 and "no CUDA device" in capsys.readouterr().err
    assert not (tmp_path / "x").exists()


def test_options_that_cannot_measure_are_refused_before_anything_runs(tmp_path, capsys):
    for args, message in ((["--image-size", "0"], "--image-size must be ≥ 1, got 0"),
                          (["--arms", "fp32,bf61"], "--arms: unknown arm bf61 (arms: fp32, tf32, fp16, bf16, "),
                          (["--overhead-arms", "fp23"], "--overhead-arms: unknown arm fp23"),
                          (["--steps", "3", "--window", "2"], "--steps: 3 is less than 2 × the window (2)"),
                          (["--warmup-steps", "-1"], "--warmup-steps: -1 is below 0"),
                          (["--rounds", "0"], "--rounds: 0 is below 1"),
                          # What the user typed and the flag, not the name of the function that parses it.
                          (["--arm-budget", "abc"], "argument --arm-budget: 'abc' is not a number of seconds or "
                                                    '"none"'),
                          (["--arm-budget", "inf"], "argument --arm-budget: 'inf' is not a positive, finite number"),
                          (["--steps", "3.5"], "argument --steps: '3.5' is not a whole number")):
        with pytest.raises(SystemExit) as exc:
            main([*TINY, *args, "--json", str(tmp_path / "x")])
        err = capsys.readouterr().err
        assert exc.value.code == 2 and message in err and err.count("error:") == 1, err
    assert not (tmp_path / "x").exists()


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
    at a time, so no other arm's model, gradients or optimizer state is in its peak. (CUDA's peak counter, faked:
    on a CPU the harness measures no memory at all, since peak RSS cannot be told apart by arm.)"""
    import weakref

    from ampbench.speed import harness

    live = weakref.WeakSet()
    alive_at_reset = []
    init = harness.LoopArm.__init__

    def tracked_init(self, *args, **kwargs):
        init(self, *args, **kwargs)
        live.add(self)

    def counting_reset(device):
        # No gc.collect() here: the memory pass collects before building each arm itself, and in a test process
        # with a large heap every collection costs seconds.
        alive_at_reset.append(len(live))

    monkeypatch.setattr(harness.LoopArm, "__init__", tracked_init)
    monkeypatch.setattr(harness, "reset_peak_memory", counting_reset)
    monkeypatch.setattr(harness, "peak_memory_mb", lambda device: {"peak_memory_mb": 100.0 + len(live)})
    cfg = BenchConfig(device="cpu", steps=4, rounds=2, window=2, warmup_steps=1, batch_size=16, image_size=8,
                      width=4, arms=["fp32", "bf16", "fp16"], overhead_arms=[], mlflow=False)
    from ampbench.bench import loop as benchloop

    device = torch.device("cpu")
    train, val = benchloop._data(cfg, 64, device, 0), benchloop._data(cfg, 16, device, 1)
    runners = {arm: benchloop.pipeline_arm(cfg, arm, device, train, val) for arm in cfg.arms}
    alive_at_reset.append(len(live))  # the interleaved throughput rounds: every arm alive
    runners.clear()
    peaks = harness.isolated_memory(lambda arm: benchloop.pipeline_arm(cfg, arm, device, train, val), cfg.arms,
                                    torch.device("cuda"), 2)
    assert alive_at_reset == [3, 0, 0, 0]  # then the memory pass: none alive at each reset, one while it steps
    assert peaks == {"fp32": 101.0, "bf16": 101.0, "fp16": 101.0}
    assert harness.isolated_memory(lambda arm: None, cfg.arms, device, 2) == dict.fromkeys(cfg.arms)  # CPU: None


def test_bench_times_a_language_model(tmp_path):
    """`ampbench bench --task language_model`: random byte sequences through the built-in gpt, both loops."""
    out = tmp_path / "lm.json"
    assert main(["--task", "language_model", "--block-size", "16", "--width", "16", "--steps", "4", "--rounds", "1",
                 "--window", "2", "--warmup-steps", "1", "--batch-size", "8", "--arms", "fp32,bf16", "--no-mlflow",
                 "--device", "cpu", "--json", str(out)]) == 0
    r = json.loads(out.read_text())
    # The first two steps, round 0 (the warm-up step and two windows), then round 1: 4 steps, its second window
    # its value, for both loops; then rounds more while the verdicts are undecided (with fewer than 5 rounds they
    # stay so), up to 4 × 1.
    o = r["loop_overhead"]["fp32"]
    assert r["config"]["model"] == "gpt" and o["rounds"] == [4, 4] and o["verdict"] == "undecided"
    assert r["arms"]["fp32"]["low_precision_flop_share"] == 0.0 and r["arms"]["bf16"]["low_precision_flop_share"] == 1.0


def test_the_harness_takes_two_steps_first_then_round_0_and_the_rounds():
    # The first call's two steps, in windows of one, take the one-off costs out of round 0 (the first step compiles:
    # --compile, torchao's optimizer) and tell the budget what a step costs; without a budget every phase runs in
    # full.
    from ampbench.speed.budget import Sizes
    from ampbench.speed.harness import measure as harness_measure

    calls = []

    class Runner:
        def round(self, steps, window):
            calls.append((steps, window))
            return [100.0] * (steps // window)

    measured = harness_measure({"a": Runner()}, Sizes(rounds=2, steps=4, window=2, warmup_steps=1, seconds=None))
    assert calls == [(2, 1), (5, 2), (4, 2), (4, 2)] and measured.rounds == {"a": [100.0, 100.0]}
    rec = measured.budgets["a"]
    assert rec["steps_measured"] == 8 and rec["rounds_run"] == 2 and rec["warmup_steps_run"] == 5
    assert not rec["cut_short"] and rec["cut"] == {}


def test_a_budget_that_fits_nothing_still_measures_one_round_and_says_what_it_cut(tmp_path, capsys):
    """A budget spent by the first call: no warm-up round, no round more; the first call's two steps (windows of
    one) are round 1, the least that measures a speed; the FLOP count still runs (kept for it), and the table and
    the JSON name each phase cut, per arm."""
    out = tmp_path / "b.json"
    args = [*TINY[:-1], "fp32,bf16", "--steps", "10", "--window", "5"]
    assert main([*args, "--device", "cpu", "--no-mlflow", "--arm-budget", "0.000001", "--json", str(out)]) == 0
    r = json.loads(out.read_text())
    printed = capsys.readouterr().out
    for arm in ("fp32", "bf16"):
        a = r["arms"][arm]
        assert a["steps_measured"] == 2 and a["rounds_run"] == 1 and a["first_call_is_round_1"]
        assert a["samples_per_s"] > 0 and a["rounds"][1:] == [None] and a["cut_short"]
        assert a["cut"] == {"warm-up": "0 of 12 steps", "rounds": "1 of 2 rounds, 2 steps (its first call's two "
                            "steps as round 1) in windows of 1, not 2 × 10 in windows of 5"}
        assert set(a["phases"]) == {"build", "first call", "flop count"} and a["low_precision_flop_share"] is not None
        assert (f"{arm} (throughput): cut by its 1e-06 s budget ({a['seconds']:.1f} s spent in all): warm-up: 0 of 12 "
                f"steps; rounds: 1 of 2 rounds, 2 steps") in printed
    assert r["arms"]["bf16"]["speedup_vs_fp32"] > 0
    # The overhead check's loops keep whole windows (their cost comes every 10 steps), so their first calls, in
    # windows of one step, are no round: no round at all, no ratio, undecided.
    o = r["loop_overhead"]["fp32"]
    assert o["rounds"] == [0, 0] and o["ratio"] is None and o["verdict"] == "undecided" and o["cut_short"]
    assert "no ratio (undecided)" in printed and r["logging"]["verdict"] == "undecided"
    assert ("fp32 (loop overhead, pipeline loop): cut by its 1e-06 s budget" in printed
            and "warm-up: 0 of 12 steps; rounds: 0 of 2 rounds, 0 steps in windows of 5" in printed)
    assert "(--arm-budget none runs every phase in full)" in printed
    with pytest.raises(SystemExit):
        main([*TINY, "--arm-budget", "0", "--json", str(out)])


@pytest.mark.parametrize("sig", ["SIGTERM", "SIGINT"])
def test_a_signal_stops_the_bench_with_one_line_and_leaves_nothing(tmp_path, sig):
    """SIGTERM or Ctrl-C while the bench measures: exit 130 within seconds, one line, no JSON, no scratch store."""
    import signal
    import subprocess
    import sys
    import time

    from conftest import clean_env

    out = tmp_path / "bench.json"
    env = clean_env(TMPDIR=str(tmp_path))  # the scratch MLflow store's folder: nothing may be left in it
    proc = subprocess.Popen([sys.executable, "-m", "ampbench.bench", "--arms", "fp32", "--overhead-arms", "fp32",
                             "--rounds", "1000", "--arm-budget", "none", "--json", str(out)], env=env, cwd=tmp_path,
                            stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    deadline = time.monotonic() + 120
    while not any(tmp_path.glob("tmp*")) and proc.poll() is None and time.monotonic() < deadline:
        time.sleep(0.1)  # its scratch folder exists: torch is imported and it measures
    time.sleep(1.0)
    proc.send_signal(getattr(signal, sig))
    _, err = proc.communicate(timeout=30)
    assert proc.returncode == 130, err
    assert err.strip().splitlines() == [f"interrupted ({sig}): nothing was written ({out} is as it was)"], err
    assert not out.exists() and not list(tmp_path.glob("tmp*"))
