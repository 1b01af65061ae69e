"""The arms past autocast: pure bf16 that trains (torchao's stochastic rounding, torch-optimi's Kahan summation)
and float8 Linear layers (torchao), on the CPU: the claim they exist for (nearest rounding cancels small updates,
the fixes keep them), what each records, and every refusal."""

import pytest
import torch
from torch import nn

from ampbench.config import arms
from ampbench.config.params import TrainParams
from ampbench.config.validation import validate
from ampbench.errors import ArmUnavailable, ParamsError
from ampbench.models.builtins import mlp, small_cnn
from ampbench.precision import float8, optimizers
from ampbench.precision.policy import plain_model, resolve_policy
from ampbench.stages.preflight import check_float8
from ampbench.training.flops import count_step_flops

CPU = torch.device("cpu")
NEW = ("bf16_sr", "bf16_kahan", "fp8_tensorwise", "fp8_rowwise")


def test_the_new_arms_are_settings_to_adopt_not_ablations_and_not_in_the_default():
    for name in NEW:
        arm = arms.get(name)
        assert not arm.ablation and not arm.default and name in arms.OPT_IN and name not in arms.MAIN
    assert arms.MAIN == ("fp32", "tf32", "fp16", "bf16")
    assert arms.get("bf16_sr").pure and arms.get("bf16_kahan").pure and not arms.get("fp8_rowwise").pure
    assert "bf16_stochastic_round=True" in arms.adoption_code(arms.get("bf16_sr"))
    assert "kahan_sum=True" in arms.adoption_code(arms.get("bf16_kahan"))
    code = arms.adoption_code(arms.get("fp8_tensorwise"))
    assert 'from_recipe_name("tensorwise")' in code and "torch.compile" in code and "bfloat16" in code


def _one_weight_trained(impl: str, lr: float, steps: int) -> torch.Tensor:
    """A bf16 weight of ones pushed by a constant gradient: Adam's update is about ``lr`` per step, far below half
    of bf16's spacing at 1.0 (2^-8) for the lr used here."""
    w = nn.Parameter(torch.ones(512, dtype=torch.bfloat16))
    torch.manual_seed(0)
    opt = optimizers.build(impl, TrainParams(lr=lr, weight_decay=0.0), [w], CPU)
    for _ in range(steps):
        w.grad = torch.ones_like(w)
        opt.step()
    return w.detach().float()


@pytest.mark.slow
def test_nearest_rounding_cancels_small_updates_and_both_fixes_keep_them():
    lr, steps = 1e-4, 200  # fp32 maths would move every weight to 1 - 200 × 1e-4 = 0.98
    nearest = _one_weight_trained("torch", lr, steps)
    assert torch.equal(nearest, torch.ones(512)), "round to nearest: every update was lost (the bf16_pure ablation)"
    kahan = _one_weight_trained("optimi_kahan", lr, steps)
    assert abs(kahan.mean().item() - 0.98) < 0.005  # the compensation buffer carries what rounding dropped
    sr = _one_weight_trained("torchao_sr", lr, steps)
    assert abs(sr.mean().item() - 0.98) < 0.005  # unbiased on average over the 512 weights
    assert sr.std().item() > 0  # and each weight a random walk around it: rounding is stochastic


def test_optimizers_match_torch_settings_and_say_what_they_are():
    model = mlp(64, 10, 32).to(torch.bfloat16)
    tp = TrainParams(optimizer="adamw", lr=0.01, weight_decay=0.1)
    kahan = optimizers.build("optimi_kahan", tp, model.parameters(), CPU)
    group = kahan.param_groups[0]
    assert (group["beta1"], group["beta2"], group["eps"], group["kahan_sum"]) == (0.9, 0.999, 1e-8, True)
    sgd = optimizers.build("optimi_kahan", TrainParams(optimizer="sgd", momentum=0.9), model.parameters(), CPU)
    assert sgd.param_groups[0]["torch_init"] and sgd.param_groups[0]["momentum"] == 0.9
    d = optimizers.describe(kahan)
    assert d["optimizer_class"] == "optimi.adamw.AdamW" and d["optimizer_rounding"].startswith("Kahan")
    assert optimizers.describe(optimizers.build("torch", tp, model.parameters(), CPU))["optimizer_rounding"] == \
        "round to nearest (no compensation)"
    with pytest.raises(ValueError, match="no 'sgd'"):
        optimizers.build("torchao_sr", TrainParams(optimizer="sgd"), model.parameters(), CPU)


def test_state_bytes_counts_weights_gradients_and_optimizer_state():
    tp = TrainParams(optimizer="adamw")
    counted = {}
    for arm in ("fp32", "bf16_kahan", "bf16_pure"):
        policy = resolve_policy(arm, CPU)
        model = policy.prepare_model(mlp(64, 10, 32))
        opt = policy.make_optimizer(tp, model.parameters(), CPU)
        loss = model(policy.cast_input(torch.randn(4, 1, 8, 8))).float().sum()
        loss.backward()
        opt.step()
        counted[arm] = optimizers.state_bytes(model, opt)
    n = sum(p.numel() for p in mlp(64, 10, 32).parameters())
    assert counted["fp32"]["weights"] == counted["fp32"]["gradients"] == 4 * n
    assert counted["fp32"]["optimizer"] >= 8 * n  # exp_avg and exp_avg_sq in float32 (+ step counters)
    assert counted["bf16_pure"]["weights"] == 2 * n and counted["bf16_pure"]["optimizer"] >= 4 * n
    assert counted["bf16_kahan"]["optimizer"] >= 6 * n  # + the bf16 compensation buffer
    assert counted["fp32"]["per_parameter"] > counted["bf16_kahan"]["per_parameter"] > \
        counted["bf16_pure"]["per_parameter"]


def test_float8_choices_say_which_linear_layers_convert_and_why_not():
    model = mlp(64, 10, 128)  # Flatten, 64→128, ReLU, 128→128, ReLU, 128→10
    chosen = {c["module"]: c for c in float8.choices(model, ["3"])}
    assert chosen["1"]["converted"] and chosen["1"]["reason"] is None
    assert chosen["3"]["reason"] == "kept in float32 (train.fp32_modules)"
    assert chosen["5"]["reason"] == "128→10 not divisible by 16"
    with pytest.raises(ValueError, match="no Linear layer of the model can train in float8"):
        float8.convert(small_cnn(1, 10, 16), "tensorwise")  # its only Linear is the 32→10 head


def test_prepare_model_converts_a_copy_and_the_record_reads_it_back():
    policy = resolve_policy("fp8_rowwise", CPU)
    plain = mlp(64, 10, 128)
    model = policy.prepare_model(plain)
    assert all(type(m) is nn.Linear for m in plain.modules() if isinstance(m, nn.Linear)), "the caller's stays plain"
    rec = float8.record(model, "rowwise")
    assert (rec["converted"], rec["linear_layers"]) == (2, 3)
    assert [r["module"] for r in rec["modules"] if not r["converted"]] == ["5"]
    back = plain_model(model)
    assert all(type(m) is nn.Linear for m in back.modules() if isinstance(m, nn.Linear))
    assert torch.equal(back.state_dict()["1.weight"], plain.state_dict()["1.weight"])


def test_float8_matmuls_run_on_this_cpu_and_are_counted_in_float8():
    assert float8.cpu_can_run() is None, "torch 2.14 runs torch._scaled_mm on float8 operands on the CPU"
    for arm, dtypes in (("fp8_tensorwise", {"float8_e4m3fn", "float8_e5m2"}), ("fp8_rowwise", {"float8_e4m3fn"})):
        policy = resolve_policy(arm, CPU)
        model = policy.prepare_model(mlp(64, 10, 128))
        counted = count_step_flops(model, policy, torch.randn(8, 1, 8, 8), torch.randint(0, 10, (8,)))
        assert dtypes <= set(counted["by_dtype"]) and counted["by_dtype"].get("float32", 0) == 0
        # the unconverted 128→10 head runs under bf16 autocast
        assert counted["by_dtype"]["bfloat16"] < sum(counted["by_dtype"][d] for d in dtypes)


def test_gpus_below_the_recipes_capability_refuse_with_the_reason(monkeypatch):
    monkeypatch.setattr(torch.cuda, "is_bf16_supported", lambda including_emulation=True: True)
    gpu = torch.device("cuda", 0)
    monkeypatch.setattr("ampbench.precision.policy._cuda_capability", lambda device: (8, 6))
    with pytest.raises(ArmUnavailable, match=r"tensorwise needs compute capability ≥ 8.9 .*this GPU is 8.6"):
        resolve_policy("fp8_tensorwise", gpu)
    monkeypatch.setattr("ampbench.precision.policy._cuda_capability", lambda device: (8, 9))
    assert resolve_policy("fp8_tensorwise", gpu).float8_recipe == "tensorwise"
    with pytest.raises(ArmUnavailable, match=r"rowwise needs compute capability ≥ 9.0"):
        resolve_policy("fp8_rowwise", gpu)
    monkeypatch.setattr("ampbench.precision.policy._cuda_capability", lambda device: (9, 0))
    assert resolve_policy("fp8_rowwise", gpu).float8_recipe == "rowwise"


def test_a_missing_library_skips_the_arm_with_the_install_line(monkeypatch):
    import importlib.util

    real = importlib.util.find_spec
    monkeypatch.setattr(importlib.util, "find_spec", lambda name, *a: None if name == "optimi" else real(name, *a))
    with pytest.raises(ArmUnavailable, match=r"bf16_kahan needs torch-optimi.*pip install torch-optimi"):
        resolve_policy("bf16_kahan", CPU)


@pytest.mark.parametrize("over, key, words", [
    ({"precisions": ["fp32", "bf16_sr"], "optimizer": "adam"}, "train.optimizer", "has only adamw"),
    ({"precisions": ["fp32", "bf16_kahan"], "fp32_modules": ["head"]}, "train.fp32_modules", "pure-bf16 arm"),
    ({"precisions": ["fp32", "bf16_sr"], "fp32_modules": ["head"]}, "train.fp32_modules", "drop bf16_sr"),
])
def test_settings_an_arm_cannot_honour_are_refused_in_one_line(over, key, words):
    with pytest.raises(ParamsError) as err:
        validate({"train": over})
    assert str(err.value).startswith(f"{key}: ") and words in str(err.value) and "\n" not in str(err.value)


def test_kahan_takes_every_optimizer_and_fp8_takes_fp32_modules():
    for opt in ("sgd", "adam", "adamw"):
        validate({"train": {"precisions": ["fp32", "bf16_kahan"], "optimizer": opt}})
    validate({"train": {"precisions": ["fp32", "fp8_tensorwise"], "fp32_modules": ["head"]}})


def test_fp8_refusals_before_any_arm_trains():
    tp = TrainParams(precisions=["fp32", "fp8_tensorwise"])
    with pytest.raises(ParamsError, match=r"^train.model: no Linear layer .* 32→10 not divisible by 16"):
        check_float8(["fp8_tensorwise"], small_cnn(1, 10, 16), [], tp, CPU)
    with pytest.raises(ParamsError, match=r"^train.model: .*1: kept in float32"):  # fp32_modules took the rest
        check_float8(["fp8_tensorwise"], mlp(64, 16, 128), ["1", "3", "5"], tp, CPU)
    check_float8(["fp8_tensorwise"], mlp(64, 10, 128), [], tp, CPU)  # eligible layers, CPU: fine uncompiled
    with pytest.raises(ParamsError, match=r"^train.compile: .*-S train.compile=true"):
        check_float8(["fp8_tensorwise"], mlp(64, 10, 128), [], tp, torch.device("cuda"))


@pytest.fixture(scope="module")
def digits(tmp_path_factory):
    from ampbench.config.params import PrepareParams
    from ampbench.data.prepare import prepare

    return prepare(PrepareParams(dataset="digits", max_train=480), tmp_path_factory.mktemp("raw"))


def _fit(arm: str, data) -> float:
    from ampbench.runtime.determinism import seed_everything
    from ampbench.training.loop import fit, init_state
    from ampbench.training.state import LoopConfig

    seed_everything(0)
    policy = resolve_policy(arm, CPU)
    policy.apply_backend_flags()
    model = policy.prepare_model(mlp(64, data.num_classes, 64))
    cfg = LoopConfig(TrainParams(epochs=4, batch_size=32, lr=0.003, progress=False), seed=0)
    state = init_state(model, policy, cfg, CPU)
    records = fit(state, data.train, data.val, policy, cfg)
    assert isinstance(records[-1].lr, float)  # torchao keeps lr as a tensor; the record holds a number
    return records[-1].val_accuracy


@pytest.mark.slow
def test_every_new_arm_trains_digits_close_to_fp32(digits):
    ref = _fit("fp32", digits)
    assert ref > 0.85
    for arm in NEW:
        assert abs(_fit(arm, digits) - ref) <= 0.04, arm


@pytest.mark.slow
def test_the_stages_record_and_report_what_each_new_arm_ran(tmp_path, tiny_params, write_params, mlflow_store):
    """Train (bf16_sr, bf16_kahan, fp8_tensorwise), speed and evaluate stages in this process: summary.json,
    MLflow tags and metrics, comparison.json and the report say what ran."""
    import json

    import mlflow
    from click.testing import CliRunner
    from pipeline.evaluate import main as evaluate_stage
    from pipeline.speed import main as speed_stage

    from conftest import prepare_in_process, torch_flags_restored, train_in_process

    chosen = ["fp32", "bf16_sr", "bf16_kahan", "fp8_tensorwise"]
    tiny_params["train"].update(model="mlp", precisions=chosen)
    tiny_params["speed"].update(rounds=1, steps=4, window=2, warmup_steps=1)
    params = write_params(tiny_params)
    prepared = prepare_in_process(params, tmp_path / "prepared")
    for arm in chosen:
        train_in_process(["--params", params, "--precision", arm, "--data", prepared, "--out",
                          tmp_path / "models" / arm, "--resume-dir", tmp_path / ".resume" / arm], mlflow_store)
    summary = {a: json.loads((tmp_path / "models" / a / "summary.json").read_text()) for a in chosen}
    assert summary["bf16_sr"]["optimizer"]["optimizer_class"] == "torchao.optim.adam._AdamW"
    assert summary["bf16_kahan"]["optimizer"]["optimizer_rounding"].startswith("Kahan summation")
    assert summary["bf16_sr"]["state_bytes"]["weights"] * 2 == summary["fp32"]["state_bytes"]["weights"]
    f8 = summary["fp8_tensorwise"]["float8"]
    assert f8["recipe"] == "tensorwise" and (f8["converted"], f8["linear_layers"]) == (2, 3)
    assert summary["fp8_tensorwise"]["flops"]["by_dtype"].get("float8_e4m3fn")
    runs = mlflow.search_runs(search_all_experiments=True, filter_string="tags.`ampbench.role` = 'arm'")
    by_arm = {r["tags.precision"]: r for _, r in runs.iterrows()}
    assert by_arm["bf16_sr"]["tags.optimizer.rounding"].startswith("stochastic rounding")
    assert by_arm["fp8_tensorwise"]["tags.float8.left_out"] == "5: 128→10 not divisible by 16"
    per_parameter = {a: by_arm[a]["metrics.state_bytes_per_parameter"] for a in ("fp32", "bf16_kahan")}
    assert per_parameter["bf16_kahan"] < per_parameter["fp32"]
    with pytest.MonkeyPatch.context() as mp, torch_flags_restored():
        mp.setenv("MLFLOW_TRACKING_URI", mlflow_store)
        speed = CliRunner().invoke(speed_stage, ["--params", str(params), "--data", str(prepared), "--out",
                                                 str(tmp_path / "reports" / "speed.json")])
        assert speed.exit_code == 0, speed.output
        done = CliRunner().invoke(evaluate_stage, ["--params", str(params), "--data", str(prepared), "--models",
                                                   str(tmp_path / "models"), "--reports", str(tmp_path / "reports"),
                                                   "--speed", str(tmp_path / "reports" / "speed.json")])
        assert done.exit_code == 0, done.output
    details = json.loads((tmp_path / "reports" / "details.json").read_text())
    assert details["bf16_kahan"]["state_bytes_per_parameter"] == pytest.approx(10.0, abs=0.01)
    assert all(details[a]["status"] == "ok" for a in chosen)
    report = (tmp_path / "reports" / "report.md").read_text()
    assert "float8 tensorwise: 2 of 3 Linear layers converted (1, 3), left out: 5 (128→10 not divisible by 16)" \
        in report
    assert "optimizer torchao.optim.adam._AdamW, stochastic rounding of the bfloat16 weight write" in report
    assert "| bf16_sr | " in report and "(ablation)" not in report.split("| bf16_sr |")[0][-20:]


@pytest.mark.gpu
def test_on_a_gpu_each_new_arm_trains_compiled_steps_or_says_why_not():
    """On the GPU: every new arm the GPU can run trains 20 compiled steps of an MLP to a finite, falling loss with
    its weights, optimizer and float8 layers as named; the ones it cannot run say why (compute capability)."""
    gpu = torch.device("cuda")
    x, y = torch.randn(256, 1, 8, 8, device=gpu), torch.randint(0, 16, (256,), device=gpu)  # one batch, learned
    for arm in NEW:
        try:
            policy = resolve_policy(arm, gpu)
        except ArmUnavailable as exc:
            assert "compute capability" in str(exc) or "bf16" in str(exc)
            continue
        torch.manual_seed(0)
        model = policy.prepare_model(mlp(64, 16, 128).to(gpu))
        opt = policy.make_optimizer(TrainParams(), model.parameters(), gpu)
        step_model = torch.compile(model)
        losses = []
        for _ in range(20):
            opt.zero_grad(set_to_none=True)
            with policy.autocast():
                loss = torch.nn.functional.cross_entropy(step_model(policy.cast_input(x)).float(), y)
            loss.backward()
            opt.step()
            losses.append(loss.item())
        assert all(torch.isfinite(torch.tensor(losses))) and losses[-1] < losses[0], (arm, losses)
        if policy.float8_recipe:
            assert float8.record(model, policy.float8_recipe)["converted"] == 3  # 64→128, 128→128, 128→16
        else:
            assert all(p.dtype == torch.bfloat16 for p in model.parameters())


def test_the_check_stage_names_the_arms_a_missing_package_will_skip(monkeypatch, tmp_path, tiny_params, write_params):
    """Issue 49.7: the check stage called a run valid whose arms need torchao while torchao was absent; they were
    only skipped at their train stage. Now one line per such arm, with the install line, and the run goes on
    (skipping is what an opt-in arm does without its package); an arm whose package is there gets no line."""
    import importlib.util

    from click.testing import CliRunner

    from test_cli import _stage

    real = importlib.util.find_spec
    monkeypatch.setattr(importlib.util, "find_spec", lambda name, *a: None if name == "torchao" else real(name, *a))
    tiny_params["train"].update(precisions=["fp32", "bf16_sr", "bf16_kahan", "fp8_tensorwise"], optimizer="adamw")
    out = tmp_path / "checked.txt"
    result = CliRunner().invoke(_stage("check"), ["--params", str(write_params(tiny_params)), "--out", str(out)])
    assert result.exit_code == 0, result.output
    assert result.stderr.strip().splitlines() == [
        f"train.precisions: {arm} will be skipped: {arm} needs torchao, which is not installed (pip install torchao)"
        for arm in ("bf16_sr", "fp8_tensorwise")]
    assert result.stdout.strip() == "params.yaml: valid" and out.exists()


@pytest.mark.parametrize("stage, error", [
    ("check", "ImportError(\"cannot import name '_C' from partially initialized module 'torchao'\")"),
    ("check", "RuntimeError('torchao 0.18 was built for another torch\\nits second line')"),
    ("train", "RuntimeError('torchao 0.18 was built for another torch')"),
], ids=["check-import-error", "check-runtime-error", "train-runtime-error"])
def test_a_broken_install_of_an_optional_package_is_named_as_such(stage, error, tmp_path, tiny_params, write_params):
    """Issue 49.7: a torchao whose import raises (here a fake one first on PYTHONPATH) passed the check stage (its
    module was found) and, at the train stage, was blamed on "your code" (its file lies outside site-packages).
    Now both stages say one line: the arm, the package, the error's first line, a broken install, not your code."""
    import subprocess
    import sys

    from conftest import ROOT, clean_env, prepare_in_process

    site = tmp_path / "site"
    (site / "torchao").mkdir(parents=True)
    (site / "torchao" / "__init__.py").write_text(f"raise {error}\n")
    tiny_params["train"].update(precisions=["fp32", "bf16_sr"], optimizer="adamw")
    tiny_params["mlflow"]["log_model"] = False
    params = write_params(tiny_params)
    out = tmp_path / "out"
    args = ["--params", str(params), "--out", str(out / "checked.txt")]
    if stage == "train":
        args = ["--params", str(params), "--precision", "bf16_sr", "--out", str(out / "bf16_sr"), "--resume-dir",
                str(out / ".resume"), "--data", str(prepare_in_process(params, tmp_path / "prepared"))]
    env = clean_env(PYTHONPATH=str(site), MLFLOW_TRACKING_URI=f"sqlite:///{tmp_path / 'mlflow.db'}",
                    AMPBENCH_PRELOAD="0")
    done = subprocess.run([sys.executable, str(ROOT / "pipeline" / f"{stage}.py"), *args], env=env,
                          capture_output=True, text=True, timeout=300)
    assert done.returncode == 2, done.stderr[-3000:]
    kind = error.partition("(")[0]
    [line] = [ln for ln in done.stderr.strip().splitlines() if ln.startswith("error:")]
    assert line == done.stderr.strip().splitlines()[-1] and "Traceback" not in done.stderr, done.stderr[-3000:]
    assert line.startswith(f"error: bf16_sr needs torchao, whose install is broken: importing torchao.optim raises "
                           f"{kind}: "), line
    assert "(a broken install of torchao, not your code); reinstall it (pip install --force-reinstall torchao)" in line
    assert "second line" not in line and "raised in your code" not in line
    assert not out.exists() and not (tmp_path / "mlflow.db").exists()  # before any output or MLflow run
