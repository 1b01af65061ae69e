"""Time to fp32's quality (issue 26): steps to fp32's final validation loss of the same seed (within the loss
margin) × the speed stage's time per step, as a ratio to fp32's own; never, said so."""

import pytest

from ampbench.verdict.quality import arm_quality, curve_rows, first_reaching, quality_metrics, text


def points(*losses, every=10, seconds_per_step=0.5):
    return [{"step": every * (i + 1), "seconds": every * (i + 1) * seconds_per_step, "val_loss": v}
            for i, v in enumerate(losses)]


FP32 = {"0": points(1.0, 0.6, 0.45, 0.40), "1": points(1.0, 0.5, 0.42, 0.41)}


def test_the_first_point_at_or_below_the_target_and_never():
    assert first_reaching(points(1.0, 0.5, 0.4), 0.5)["step"] == 20  # the end of the margin counts
    assert first_reaching(points(1.0, 0.9), 0.5) is None


def test_steps_and_time_to_fp32_quality_as_ratios():
    """The target is fp32's final loss + the margin (0.40 + 0.02; 0.41 + 0.02): fp32 gets there at its step 40 and
    30, an arm with the same curve one evaluation sooner at 30 and 20; at 2× fp32's speed per step, its time is
    half its steps ratio."""
    arm = {"0": points(0.9, 0.5, 0.41, 0.39), "1": points(0.8, 0.42, 0.41, 0.40)}
    q = arm_quality(arm, FP32, margin=0.02, speedup=2.0)
    assert q.per_seed["0"]["steps"] == 30 and q.per_seed["0"]["fp32_steps"] == 40
    assert q.per_seed["1"]["steps"] == 20 and q.per_seed["1"]["fp32_steps"] == 30
    assert q.steps_vs_fp32 == pytest.approx((30 / 40 + 20 / 30) / 2)
    assert q.time_vs_fp32 == pytest.approx(q.steps_vs_fp32 / 2)
    assert q.train_time_vs_fp32 == pytest.approx(q.steps_vs_fp32)  # the same wall time per step here
    assert text(q) == f"{q.time_vs_fp32:.2f}×" and (q.seeds_reached, q.seeds) == (2, 2)
    assert quality_metrics(q, 0) == {"steps_to_fp32_quality": 30, "time_to_fp32_quality_x": 0.375}
    assert arm_quality(FP32, FP32, 0.02, 1.0).time_vs_fp32 == 1.0  # fp32 against itself


def test_an_arm_that_never_gets_there_in_a_seed_has_no_ratio_and_says_so():
    arm = {"0": points(0.9, 0.5, 0.41, 0.39), "1": points(1.0, 0.8, 0.7, 0.6)}
    q = arm_quality(arm, FP32, margin=0.02, speedup=1.5)
    assert q.per_seed["1"]["steps"] is None and q.time_vs_fp32 is None and q.seeds_reached == 1
    assert text(q) == "never in 1 of 2 seeds" and quality_metrics(q, 1) == {}
    assert text(arm_quality({}, FP32, 0.02, 1.0)) == "n/a"  # an arm trained before evaluations were recorded


def test_the_plot_rows_put_time_on_the_speed_stages_clock():
    rows = curve_rows("bf16", {"0": points(0.9, 0.5)}, seconds_per_step=0.01)
    assert rows == [{"run": "bf16-seed0", "arm": "bf16", "seed": 0, "step": 10, "seconds": 0.1, "val_loss": 0.9},
                    {"run": "bf16-seed0", "arm": "bf16", "seed": 0, "step": 20, "seconds": 0.2, "val_loss": 0.5}]
    assert curve_rows("bf16", {"0": points(0.9)}, None)[0]["seconds"] == 5.0  # no speed stage: training's own
