"""The one-line recommendation that opens reports/report.md (and tags the MLflow comparison run)."""

from dataclasses import replace

import pytest

from ampbench.report.advice import recommendation
from ampbench.report.context import RunContext


def row(verdict="equivalent", loss_verdict="equivalent", speed=1.0, memory=1.0, skipped=0, steps=1000,
        not_worse=None, loss_not_worse=None, **extra):
    """An arm's merged row; the not-worse verdicts follow the equivalence ones unless given."""
    follow = {"equivalent": "not worse", "better": "not worse", "baseline": "baseline"}
    return {"status": "ok", "ablation": False, "verdict": verdict, "loss_verdict": loss_verdict,
            "not_worse": not_worse or follow.get(verdict, verdict),
            "loss_not_worse": loss_not_worse or follow.get(loss_verdict, loss_verdict),
            "samples_per_s": 1000 * speed, "speedup_vs_fp32": speed, "memory_vs_fp32": memory,
            "skipped_steps": skipped, "optimizer_steps": steps, "delta_accuracy_pp": -0.05,
            "delta_accuracy_pp_ci_low": -0.3, "delta_accuracy_pp_ci_high": 0.2, "delta_accuracy_pp_bound": -0.25,
            **extra}


GPU = RunContext(device_type="cuda")


def test_the_fastest_equivalent_healthy_arm_is_recommended_with_its_code():
    merged = {"fp32": row(verdict="baseline", loss_verdict="baseline"), "tf32": row(speed=2.0),
              "fp16": row(speed=4.5, memory=0.55, speedup_vs_tf32=2.25), "bf16": row(speed=4.2, memory=0.56)}
    line, code = (rec := recommendation(merged, GPU)).line, rec.code
    assert line.startswith("**Recommendation: switch to fp16.**")
    assert "4.50× fp32's samples/s, 2.25× tf32's, 0.55× its peak memory" in line
    assert "\n" not in line and "Measured on a CPU" not in line
    assert "torch.amp.GradScaler(\"cuda\")" in code and "dtype=torch.float16" in code and "scaler.update()" in code


def test_an_unhealthy_scaler_or_a_non_equivalent_verdict_rules_an_arm_out():
    merged = {"fp32": row(verdict="baseline", loss_verdict="baseline"),
              "fp16": row(speed=4.5, skipped=300, steps=1000), "bf16": row(speed=4.2, loss_verdict="inconclusive"),
              "tf32": row(speed=1.8, verdict="worse")}
    line, code = (rec := recommendation(merged, replace(GPU, seeds=[0, 1, 2]))).line, rec.code
    assert line.startswith("**Recommendation: stay on fp32.**") and code == ""
    assert "fp16: its scaler skipped 300 of 1000 optimizer steps" in line
    assert "bf16: loss inconclusive" in line and "tf32: accuracy worse" in line
    assert "dvc exp run --temp -S 'train.seeds=[0,1,2,3,4,5]'" in line  # inconclusive: more seeds would help


def test_the_more_seeds_advice_is_derived_from_the_seeds_that_ran():
    """Issue 29.4: the advice once suggested `train.seeds=[0,1,2,3,4]` after a run with exactly those seeds."""
    merged = {"fp32": row(verdict="baseline", loss_verdict="baseline"), "bf16": row(speed=2.0, verdict="inconclusive")}
    line = recommendation(merged, replace(GPU, seeds=[0, 1, 2, 3, 4])).line
    assert "'train.seeds=[0,1,2,3,4,5,6,7,8,9]'" in line
    line = recommendation(merged, replace(GPU, seeds=[7])).line
    assert "'train.seeds=[7,0,1]'" in line


def test_a_better_arm_is_not_worse_and_can_be_recommended_with_a_warning_beyond_seed_noise():
    """Issue 29.2: "bf16 better (+6.67 pp)" with "stay on fp32" read as a contradiction. Non-inferiority decides:
    a better arm passes it; being better by more than fp32's seed noise earns a note, not a celebration."""
    merged = {"fp32": row(verdict="baseline", loss_verdict="baseline"),
              "bf16": row(speed=1.5, verdict="better", loss_verdict="better", vs_seed_noise="beyond",
                           delta_accuracy_pp=6.67, delta_accuracy_pp_bound=3.1)}
    line, code = (rec := recommendation(merged, GPU)).line, rec.code
    assert line.startswith("**Recommendation: switch to bf16.**") and "dtype=torch.bfloat16" in code
    assert "not worse than fp32 (Δaccuracy +6.67 pp, one-sided lower bound +3.10 pp; equivalence: better)" in line
    assert "Note: bf16 is better than fp32 by more than fp32's own seed-to-seed variation (Δaccuracy +6.67 pp)" in line
    merged["bf16"]["vs_seed_noise"] = "not separable"
    assert "Note:" not in recommendation(merged, GPU).line


def test_not_worse_decides_even_when_equivalence_is_inconclusive():
    """An interval that reaches past +margin (the arm might be better by more than the margin) leaves equivalence
    inconclusive, but the question asked — did anything degrade? — is answered."""
    merged = {"fp32": row(verdict="baseline", loss_verdict="baseline"),
              "bf16": row(speed=1.3, verdict="inconclusive", not_worse="not worse")}
    line = recommendation(merged, GPU).line
    assert line.startswith("**Recommendation: switch to bf16.**") and "equivalence: inconclusive" in line
    merged["bf16"]["loss_not_worse"] = "inconclusive"
    line = recommendation(merged, GPU).line
    assert line.startswith("**Recommendation: stay on fp32.**") and "bf16: loss inconclusive" in line


def test_bf16_adopts_with_autocast_only_and_ablations_are_never_recommended():
    merged = {"fp32": row(verdict="baseline", loss_verdict="baseline"), "bf16": row(speed=3.0),
              "fp16_pure": {**row(speed=9.0), "ablation": True}}
    line, code = (rec := recommendation(merged, GPU)).line, rec.code
    assert line.startswith("**Recommendation: switch to bf16.**")
    assert "dtype=torch.bfloat16" in code and "GradScaler" not in code


def test_on_cpu_slow_arms_mean_stay_on_fp32_and_the_line_says_a_gpu_differs():
    merged = {"fp32": row(verdict="baseline", loss_verdict="baseline"), "fp16": row(speed=0.14),
              "bf16": row(speed=0.15), "tf32": {"status": "skipped", "verdict": "skipped", "ablation": False}}
    line = recommendation(merged, RunContext(device_type="cpu")).line
    assert line.startswith("**Recommendation: stay on fp32.**")
    assert "fp16: not worse, but 0.14× fp32's samples/s" in line and "tf32: skipped" in line
    assert "Measured on a CPU" in line and "dvc exp run" not in line


@pytest.mark.parametrize("speed", [1.0, 1.04])
def test_a_gain_within_timing_noise_is_not_called_faster(speed):
    merged = {"fp32": row(verdict="baseline", loss_verdict="baseline"), "bf16": row(speed=speed)}
    assert recommendation(merged, GPU).line.startswith("**Recommendation: stay on fp32.**")


def test_an_input_bound_run_is_named_in_the_recommendation():
    merged = {"fp32": row(verdict="baseline", loss_verdict="baseline", input_wait_share=0.45),
              "bf16": row(speed=1.2, input_wait_share=0.6), "fp16": row(speed=1.3, input_wait_share=0.05)}
    line = recommendation(merged, GPU).line
    assert "Input-bound (fp32, bf16): the speed ratios show the input pipeline more than the precision." in line


@pytest.mark.parametrize("flags, says, not_says", [
    ("avx512_bf16,f16c", "bf16: it has AVX512_BF16, so bf16 autocast runs native kernels", "lacks AVX512-BF16"),
    ("avx512_bf16,amx_bf16,avx512_fp16,amx_fp16,f16c", "fp16: it has AMX_FP16 and AVX512_FP16", "lacks"),
    ("f16c", "bf16: it lacks AVX512-BF16 and AMX-BF16, so bf16 autocast is emulated", "it has"),
    ("none", "fp16: it lacks AVX512-FP16 and AMX-FP16", "it has"),
])
def test_the_cpu_note_says_what_this_cpu_has(flags, says, not_says):
    """Issue 29.4: the note explained slowness "without AVX512-BF16/AMX" on a CPU that had both."""
    from ampbench.report.advice import cpu_note

    note = cpu_note(flags)
    assert note.startswith(f"CPU run. This CPU's 16-bit instructions: {flags}.") and says in note
    assert not_says not in note


def test_the_speed_interval_must_clear_the_threshold_not_just_its_median():
    """Issue 29.1: with the speed stage's interval, its low end decides (1.08× [0.97, 1.20] is not faster)."""
    merged = {"fp32": row(verdict="baseline", loss_verdict="baseline"),
              "bf16": row(speed=1.08, speedup_vs_fp32_ci_low=0.97, speedup_vs_fp32_ci_high=1.2)}
    line = recommendation(merged, GPU).line
    assert line.startswith("**Recommendation: stay on fp32.**")
    assert ("bf16: not worse, but 1.08× [0.97, 1.20] fp32's samples/s (a switch needs its interval's low end at "
            "1.05× or more)") in line
    merged["bf16"]["speedup_vs_fp32_ci_low"] = 1.06
    line = recommendation(merged, GPU).line
    assert line.startswith("**Recommendation: switch to bf16.**") and "1.08× [1.06, 1.20] fp32's samples/s" in line
    # Shown as 1.05× [1.04, 1.06] (a default run on a CPU with AMX-BF16): the bar is said, as it is not plain.
    merged["bf16"].update(speedup_vs_fp32=1.046, speedup_vs_fp32_ci_low=1.04, speedup_vs_fp32_ci_high=1.06)
    line = recommendation(merged, GPU).line
    assert ("bf16: not worse, but 1.05× [1.04, 1.06] fp32's samples/s (a switch needs its interval's low end at "
            "1.05× or more)") in line


def test_memory_is_n_a_on_a_cpu_as_the_bench_says():
    """Issue 49: the first table gave `memory × fp32 1.00×` on a CPU, where peak RSS cannot be attributed to one arm
    (a process's high-water mark; a forked stage counts only the pages it touched). The report follows the bench's
    rule (runtime.memory.per_arm): n/a on a CPU, in the table and as null in the JSON rows; a ratio on CUDA."""
    from ampbench.report.markdown import first_table
    from ampbench.verdict.comparison import ArmReport
    from ampbench.verdict.tables import timing_row
    from conftest import arm_summary

    cuda = {"device_name": "NVIDIA H100", "device_type": "cuda"}
    on_gpu = {a: ArmReport(arm_summary(a, hardware=cuda, peak_memory_mb=mb)) for a, mb in (("fp32", 200.0),
                                                                                           ("bf16", 120.0))}
    assert timing_row(on_gpu["bf16"], on_gpu["fp32"], None)["memory_vs_fp32"] == 0.6
    on_cpu = {a: ArmReport(arm_summary(a, peak_memory_mb=mb)) for a, mb in (("fp32", 200.0), ("bf16", 200.0))}
    timing = {a: timing_row(r, on_cpu["fp32"], None) for a, r in on_cpu.items()}
    assert all(t["memory_vs_fp32"] is None and t["peak_memory_mb"] is None for t in timing.values())
    merged = {"fp32": row(verdict="baseline", loss_verdict="baseline", memory=timing["fp32"]["memory_vs_fp32"]),
              "bf16": row(speed=1.5, memory=timing["bf16"]["memory_vs_fp32"])}
    context = RunContext(device_type="cpu")
    table = first_table(list(on_cpu.values()), merged, context, recommendation(merged, context))
    memory_column = table[0].split(" | ").index("memory × fp32")
    assert [line.split(" | ")[memory_column] for line in table[2:]] == ["n/a", "n/a"]
