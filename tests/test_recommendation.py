"""The one-line recommendation that opens reports/report.md (and tags the MLflow comparison run)."""

import pytest

from ampbench.advice import recommendation


def row(verdict="equivalent", loss_verdict="equivalent", speed=1.0, memory=1.0, skipped=0, steps=1000, **extra):
    return {"status": "ok", "ablation": False, "verdict": verdict, "loss_verdict": loss_verdict,
            "samples_per_s": 1000 * speed, "speedup_vs_fp32": speed, "memory_vs_fp32": memory,
            "skipped_steps": skipped, "optimizer_steps": steps, "delta_accuracy_pp": -0.05,
            "delta_accuracy_pp_ci_low": -0.3, "delta_accuracy_pp_ci_high": 0.2, **extra}


GPU = {"device_type": "cuda"}


def test_the_fastest_equivalent_healthy_arm_is_recommended_with_its_code():
    merged = {"fp32": row(verdict="baseline", loss_verdict="baseline"), "tf32": row(speed=2.0),
              "fp16": row(speed=4.5, memory=0.55, speedup_vs_tf32=2.25), "bf16": row(speed=4.2, memory=0.56)}
    line, code = recommendation(merged, GPU)
    assert line.startswith("**Recommendation: switch to fp16.**")
    assert "4.50× fp32's samples/s, 2.25× tf32's, 0.55× its peak memory" in line
    assert "\n" not in line and "Measured on a CPU" not in line
    assert "torch.amp.GradScaler(\"cuda\")" in code and "dtype=torch.float16" in code and "scaler.update()" in code


def test_an_unhealthy_scaler_or_a_non_equivalent_verdict_rules_an_arm_out():
    merged = {"fp32": row(verdict="baseline", loss_verdict="baseline"),
              "fp16": row(speed=4.5, skipped=300, steps=1000), "bf16": row(speed=4.2, loss_verdict="inconclusive"),
              "tf32": row(speed=1.8, verdict="worse")}
    line, code = recommendation(merged, GPU)
    assert line.startswith("**Recommendation: stay on fp32.**") and code == ""
    assert "fp16: its scaler skipped 300 of 1000 optimizer steps" in line
    assert "bf16: loss inconclusive" in line and "tf32: accuracy worse" in line
    assert "dvc exp run --temp -S 'train.seeds=[0,1,2,3,4]'" in line  # an inconclusive verdict: more seeds would help


def test_bf16_adopts_with_autocast_only_and_ablations_are_never_recommended():
    merged = {"fp32": row(verdict="baseline", loss_verdict="baseline"), "bf16": row(speed=3.0),
              "fp16_pure": {**row(speed=9.0), "ablation": True}}
    line, code = recommendation(merged, GPU)
    assert line.startswith("**Recommendation: switch to bf16.**")
    assert "dtype=torch.bfloat16" in code and "GradScaler" not in code


def test_on_cpu_slow_arms_mean_stay_on_fp32_and_the_line_says_a_gpu_differs():
    merged = {"fp32": row(verdict="baseline", loss_verdict="baseline"), "fp16": row(speed=0.14),
              "bf16": row(speed=0.15), "tf32": {"status": "skipped", "verdict": "skipped", "ablation": False}}
    line, _ = recommendation(merged, {"device_type": "cpu"})
    assert line.startswith("**Recommendation: stay on fp32.**")
    assert "fp16: equivalent, but 0.14× fp32's samples/s" in line and "tf32: skipped" in line
    assert "Measured on a CPU" in line and "dvc exp run" not in line


@pytest.mark.parametrize("speed", [1.0, 1.04])
def test_a_gain_within_timing_noise_is_not_called_faster(speed):
    merged = {"fp32": row(verdict="baseline", loss_verdict="baseline"), "bf16": row(speed=speed)}
    assert recommendation(merged, GPU)[0].startswith("**Recommendation: stay on fp32.**")


def test_an_input_bound_run_is_named_in_the_recommendation():
    merged = {"fp32": row(verdict="baseline", loss_verdict="baseline", input_wait_share=0.45),
              "bf16": row(speed=1.2, input_wait_share=0.6), "fp16": row(speed=1.3, input_wait_share=0.05)}
    line, _ = recommendation(merged, GPU)
    assert "Input-bound (fp32, bf16): the speed ratios show the input pipeline more than the precision." in line
