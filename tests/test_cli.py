"""CLI tests: the stage commands and `ampbench`, in-process with click's CliRunner."""

from __future__ import annotations

import importlib.util
import json
from pathlib import Path

import pytest
import yaml
from click.testing import CliRunner

from ampbench.data.prepare import load_prepared
from conftest import ROOT, torch_flags_restored


def _train(arm, params, data, models):
    """Run the train stage in-process with its outputs and resume folder under the test's tmp dir."""
    args = ["--precision", arm, "--params", params, "--data", str(data), "--out", str(models / arm),
            "--resume-dir", str(models.parent / ".resume" / arm)]
    return CliRunner().invoke(_stage("train"), args)


def _stage(name):
    spec = importlib.util.spec_from_file_location(f"ampbench_stage_{name}", ROOT / "pipeline" / f"{name}.py")
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module.main


@pytest.mark.parametrize("name", ["check", "prepare", "train", "speed", "evaluate"])
def test_stage_help_documents_every_option(name):
    cmd = _stage(name)
    result = CliRunner().invoke(cmd, ["--help"])
    assert result.exit_code == 0
    for param in cmd.params:
        assert param.help, f"{name} --{param.name} has no help text"


def test_ampbench_help_and_ui_link(tmp_path, mlflow_store):
    from ampbench.cli import main

    assert CliRunner().invoke(main, ["--help"]).exit_code == 0
    (tmp_path / "params.yaml").write_text("mlflow: {experiment: uitest}\n")
    result = CliRunner().invoke(main, ["ui", "--root", str(tmp_path), "--dry-run", "--port", "5123"])
    assert result.exit_code == 0, result.output
    assert "http://127.0.0.1:5123/#/experiments/" in result.output
    assert "workflowType=machine_learning" in result.output
    assert "--host 127.0.0.1" in result.output


def test_ui_never_shows_or_passes_a_password_on_a_command_line(tmp_path, monkeypatch):
    """Issue 14.7: the store URI reaches the server through its environment; what is printed is redacted."""
    from ampbench import tracking
    from ampbench.cli import main

    monkeypatch.setenv("MLFLOW_TRACKING_URI", "postgresql://mlflow:s3cret@db.internal:5432/mlflow")
    monkeypatch.setattr(tracking, "setup", lambda root, name: "7")  # no database here; the command line is the point
    (tmp_path / "params.yaml").write_text("mlflow: {experiment: uitest}\n")
    result = CliRunner().invoke(main, ["ui", "--root", str(tmp_path), "--dry-run"])
    assert result.exit_code == 0, result.output
    assert "s3cret" not in result.output and "--backend-store-uri" not in result.output
    assert "MLFLOW_BACKEND_STORE_URI=postgresql://mlflow:***@db.internal:5432/mlflow" in result.output


def test_ui_errors_are_one_line(tmp_path, mlflow_store):
    """A busy port, a bad params file, an unreachable store: `error: …`, exit 2, no traceback, no link."""
    import socket

    from ampbench.cli import main

    (tmp_path / "params.yaml").write_text("mlflow: {experiment: uitest}\n")
    with socket.socket() as busy:
        busy.bind(("127.0.0.1", 0))
        busy.listen()
        port = busy.getsockname()[1]
        result = CliRunner().invoke(main, ["ui", "--root", str(tmp_path), "--port", str(port)])
    assert result.exit_code == 2 and result.stderr.strip() == (f"error: cannot serve on 127.0.0.1:{port} (Address "
                                                                "already in use); choose another --port")
    assert "MLflow UI:" not in result.output
    (tmp_path / "params.yaml").write_text("mlflow: [\n")
    result = CliRunner().invoke(main, ["ui", "--root", str(tmp_path)])
    assert result.exit_code == 2 and result.stderr.startswith("error: ") and "not valid YAML" in result.stderr
    (tmp_path / "params.yaml").write_text("mlflow: {experiment: uitest}\n")
    result = CliRunner().invoke(main, ["ui", "--root", str(tmp_path)],
                                env={"MLFLOW_TRACKING_URI": "http://u:pw@127.0.0.1:9/"})
    assert result.exit_code == 2 and "unreachable" in result.stderr and ":pw@" not in result.stderr
    assert result.stderr.strip().count("\n") == 0 and "Traceback" not in result.output


def _stop_ui(ui) -> None:
    """A test that failed early must not leave the server behind: SIGTERM makes `ampbench ui` stop its server's
    whole process group (a SIGKILL would orphan it); SIGKILL only if that does not end it."""
    import signal
    import subprocess

    if ui.poll() is None:
        ui.send_signal(signal.SIGTERM)
        try:
            ui.wait(timeout=60)
        except subprocess.TimeoutExpired:
            ui.kill()


@pytest.mark.slow
def test_ui_prints_the_link_once_the_server_answers(tmp_path):
    """`--port 0` picks a free port; the link (with that port) appears only when /health answers, the server's
    command line holds no store URI, Ctrl-C stops it."""
    import re
    import signal
    import subprocess
    import sys
    import urllib.request

    from conftest import clean_env

    (tmp_path / "params.yaml").write_text("mlflow: {experiment: uitest}\n")
    errors = tmp_path / "stderr.txt"
    with errors.open("w") as stderr:
        ui = subprocess.Popen([sys.executable, "-m", "ampbench.cli", "ui", "--root", str(tmp_path), "--port", "0"],
                              env=clean_env(), stdout=subprocess.PIPE, stderr=stderr, text=True)
    try:
        line = ui.stdout.readline()  # issue 29.4: the link is the first and only line, the server's output is logged
        if not line.startswith("MLflow UI:"):
            pytest.fail(f"first line {line!r}; exit {ui.poll()}")
        port = int(re.match(r"MLflow UI: http://127\.0\.0\.1:(\d+)/#/experiments/", line).group(1))
        assert port > 0 and line.rstrip().endswith(f"the server's log: {tmp_path / 'mlflow-ui.log'})")
        assert errors.read_text() == "" and (tmp_path / "mlflow-ui.log").read_text().strip()
        urllib.request.urlopen(f"http://127.0.0.1:{port}/health", timeout=5).close()  # answers already
        children = subprocess.run(["pgrep", "-P", str(ui.pid)], capture_output=True, text=True).stdout.split()
        assert children
        for pid in children:
            cmdline = Path(f"/proc/{pid}/cmdline").read_bytes().decode()
            assert "mlflow.db" not in cmdline and "backend-store-uri" not in cmdline
        ui.send_signal(signal.SIGINT)
        assert ui.wait(timeout=60) == 0
    finally:
        _stop_ui(ui)


@pytest.mark.slow
def test_sigterm_to_ui_stops_the_whole_server(tmp_path):
    """`mlflow server` runs uvicorn workers and job consumers (≈ 200 MB each): a SIGTERM to `ampbench ui` (a
    supervisor, `kill`, a test's terminate()) must stop every one of them, not leave them orphaned."""
    import os
    import signal
    import subprocess
    import sys
    import time

    from conftest import clean_env

    (tmp_path / "params.yaml").write_text("mlflow: {experiment: uitest}\n")
    ui = subprocess.Popen([sys.executable, "-m", "ampbench.cli", "ui", "--root", str(tmp_path), "--port", "0"],
                          env=clean_env(), stdout=subprocess.PIPE, stderr=subprocess.DEVNULL, text=True)
    try:
        assert any(line.startswith("MLflow UI:") for line in ui.stdout)
        (server,) = subprocess.run(["pgrep", "-P", str(ui.pid)], capture_output=True, text=True).stdout.split()
        group = subprocess.run(["pgrep", "-g", server], capture_output=True, text=True).stdout.split()
        assert len(group) > 1, "expected the server to have started workers"
        ui.send_signal(signal.SIGTERM)
        assert ui.wait(timeout=60) == 0
        deadline = time.monotonic() + 30
        while time.monotonic() < deadline and [p for p in group if os.path.exists(f"/proc/{p}")]:
            time.sleep(0.5)
        left = [p for p in group if os.path.exists(f"/proc/{p}")
                and Path(f"/proc/{p}/stat").read_text().split()[2] != "Z"]
        assert left == [], f"server processes left running: {left}"
    finally:
        _stop_ui(ui)


def test_bad_params_one_line_no_traceback_no_outputs(tmp_path, tiny_params, write_params):
    tiny_params["train"]["lr"] = -1
    path = write_params(tiny_params)
    out = tmp_path / "models" / "fp32"
    result = CliRunner().invoke(_stage("train"), ["--precision", "fp32", "--params", str(path), "--out", str(out)])
    assert result.exit_code == 2
    assert result.stderr.strip().count("\n") == 0
    assert "train.lr" in result.stderr and "Traceback" not in result.output + result.stderr
    assert not out.exists()


@pytest.fixture(scope="module")
def stages(tmp_path_factory, tiny_params_module):
    """prepare → train (fp32, a skipped tf32, bf16) → evaluate, once, in one process with log_model off; the
    tests below read what it left: (folders, comparison, details, speed, report, MLflow store URI)."""
    tmp = tmp_path_factory.mktemp("stages")
    params = tiny_params_module
    params["train"]["precisions"] = ["fp32", "tf32", "bf16"]
    params["train"]["eval_every"] = None  # the default: four validation losses per epoch (time to fp32's quality)
    params["mlflow"]["log_model"] = False
    path = tmp / "params.yaml"
    path.write_text(yaml.safe_dump(params))
    data, models, reports = tmp / "prepared", tmp / "models", tmp / "reports"
    uri = f"sqlite:///{tmp / 'mlflow.db'}"
    with pytest.MonkeyPatch.context() as mp, torch_flags_restored():
        mp.setenv("MLFLOW_TRACKING_URI", uri)
        runner = CliRunner()
        r = runner.invoke(_stage("prepare"), ["--params", str(path), "--out", str(data)])
        assert r.exit_code == 0, r.output
        for arm in params["train"]["precisions"]:
            r = _train(arm, str(path), data, models)
            assert r.exit_code == 0, r.output + str(r.exception)
        r = runner.invoke(_stage("speed"), ["--params", str(path), "--data", str(data), "--out",
                                            str(reports / "interleaved.json")])
        assert r.exit_code == 0, r.output + str(r.exception)
        assert "[tf32] skipped: tf32 is a CUDA tensor-core mode" in r.output and "× fp32 [" in r.output
        r = runner.invoke(_stage("evaluate"), ["--params", str(path), "--data", str(data), "--models", str(models),
                                               "--reports", str(reports)])
        assert r.exit_code == 0, r.output + str(r.exception)
    read = lambda name: json.loads((reports / name).read_text())  # noqa: E731
    return {"data": data, "models": models, "reports": reports, "comparison": read("comparison.json"),
            "details": read("details.json"), "speed": read("speed.json"), "uri": uri,
            "report": (reports / "report.md").read_text()}


def test_stages_write_every_report(stages):
    metrics, details, speed = stages["comparison"], stages["details"], stages["speed"]
    skipped = json.loads((stages["models"] / "tf32" / "summary.json").read_text())["skipped"]
    assert "tf32 is a CUDA tensor-core mode" in skipped
    assert metrics["tf32"] == {"verdict": "skipped"} and "tf32 is a CUDA" in details["tf32"]["reason"]
    assert metrics["fp32"]["verdict"] == "baseline" and details["fp32"]["delta_accuracy_pp"] == 0.0
    # Δ is bf16 − fp32 of the same seed on the same examples: the three numbers agree (to the files' rounding).
    assert details["bf16"]["test_accuracy"] - details["fp32"]["test_accuracy"] == pytest.approx(
        metrics["bf16"]["delta_accuracy_pp"] / 100, abs=2e-6)
    assert set(speed) == {"fp32", "bf16"} and set(speed["bf16"]) == {"speedup_vs_fp32"}
    # On a CPU peak memory cannot be attributed to one arm (issue 49): no ratio in speed.json, null in details.json,
    # n/a in the report's memory column, as the bench says.
    assert details["bf16"]["memory_vs_fp32"] is None and details["bf16"]["peak_memory_mb"] is None
    assert "Peak memory n/a: CPU: peak RSS is the process's high-water mark" in stages["report"]
    # Issue 29.1: the speed is the speed stage's, interleaved, with its interval; training time is secondary.
    inter = json.loads((stages["reports"] / "interleaved.json").read_text())
    assert details["bf16"]["speed_source"] == "interleaved" and details["bf16"]["train_samples_per_s"] > 0
    assert details["bf16"]["speedup_vs_fp32"] == pytest.approx(inter["arms"]["bf16"]["speedup_vs_fp32"], abs=1e-4)
    low, high = details["bf16"]["speedup_vs_fp32_ci_low"], details["bf16"]["speedup_vs_fp32_ci_high"]
    assert low <= details["bf16"]["speedup_vs_fp32"] <= high and len(inter["arms"]["bf16"]["rounds"]) == 3
    assert "interleaved round by round" in stages["report"] and f"× [{low:.2f}, {high:.2f}]" in stages["report"]
    for png in ("curves.png", "accuracy_delta.png", "speed_memory.png"):
        assert (stages["reports"] / "figures" / png).stat().st_size > 10_000
    assert "| bf16 |" in stages["report"]
    curves = json.loads((stages["reports"] / "curves.json").read_text())
    assert {row["run"] for row in curves} == {"fp32-seed0", "bf16-seed0"}
    # Issue 29.4: no loss-scale line for arms without a scaler (null: DVC needs the field in every row).
    assert all(row["loss_scale"] is None for row in curves)
    assert all(row["val_loss"] is not None for row in curves)
    template = json.loads((ROOT / ".dvc" / "plots" / "arms.json").read_text())["encoding"]
    assert template["color"]["field"] == "arm" and template["strokeDash"]["field"] == "seed"  # a colour per arm
    # Issue 29.2: not-worse verdicts beside equivalence, in comparison.json, the report and the reasons.
    assert metrics["bf16"]["not_worse"] in ("not worse", "worse", "inconclusive")
    assert details["bf16"]["delta_accuracy_pp_bound"] >= details["bf16"]["delta_accuracy_pp_ci_low"]
    assert details["bf16"]["delta_loss_bound"] <= details["bf16"]["delta_loss_ci_high"]
    assert "| arm | not worse? | equivalent? |" in stages["report"]
    assert f"**bf16**: Accuracy: not worse? **{details['bf16']['not_worse']}**: " in stages["report"]
    assert "one-sided 95% lower bound" in stages["report"] or "one-sided 95% upper bound" in stages["report"]


def test_the_reports_first_screen_answers_the_question(stages):
    """The recommendation, then one table of at most eight columns within the first 120 words, one row per arm
    with its reason; the details below their own heading, the full table among them."""
    report = stages["report"]
    first_screen, details = report.split("\n## Details\n", 1)
    tables = [line for line in first_screen.splitlines() if line.startswith("|")]
    header = tables[0]
    assert header.count(" | ") + 1 <= 8 and header.startswith("| arm | not worse? | Δaccuracy, pp [95% CI] |")
    assert len(report[:report.index(header)].split()) <= 120
    assert len(tables) == 2 + len(stages["details"]) and "| tf32 | **skipped** |" in first_screen  # an arm a row
    assert "undecided; *" in first_screen or "decided; its speed" in first_screen  # bf16's reason, in its row
    assert "| arm | not worse? | equivalent? |" in details and "Why each verdict:" in details
    assert "Why each verdict" not in first_screen and "### Numerics" in details


def test_one_seed_is_said_not_hidden(stages):
    """One seed: the interval covers example sampling only, and the verdict says so instead of pretending."""
    details = stages["details"]
    assert details["bf16"]["delta_accuracy_pp_ci_low"] < details["bf16"]["delta_accuracy_pp_ci_high"]
    assert details["bf16"]["paired_examples"] == len(load_prepared(stages["data"]).test)  # 1 seed × every example
    assert "with 1 seed, the seed-to-seed variation was not measured (it is not in the interval)" in stages["report"]
    first = stages["report"].splitlines()[2]  # the recommendation opens the report; bf16's speed varies by CPU
    assert first.startswith("**Recommendation: ") and "Measured on a CPU" in first


def test_the_parent_run_holds_the_comparison(stages):
    import mlflow

    from ampbench.runtime.files import dvc_md5

    mlflow.set_tracking_uri(stages["uri"])
    runs = mlflow.search_runs(experiment_names=["ampbench-tests"], output_format="list")
    by_name = {run.info.run_name: run for run in runs}
    (parent,) = [r for r in runs if r.data.tags.get("ampbench.role") == "execution"]  # one per execution
    assert set(by_name) == {"fp32-seed0", "bf16-seed0", parent.info.run_name}
    assert parent.info.run_name.startswith("repro@")  # no DVC experiment: named after the commit
    assert all(run.info.status == "FINISHED" for run in runs)
    for name in ("fp32-seed0", "bf16-seed0"):
        assert by_name[name].data.tags["mlflow.parentRunId"] == parent.info.run_id
    p, first = parent.data, stages["report"].splitlines()[2]
    # The tag is the whole recommendation (each arm's reason in it); the report says the reasons in its table.
    assert p.tags["recommendation"].split(" (")[0] == first.replace("**", "").split(" (")[0]
    assert "tf32: skipped" in p.tags["recommendation"] and "skipped.tf32" in p.tags
    assert p.tags["verdict.bf16"] == "inconclusive" and p.tags["dvc.data_md5"] == dvc_md5(stages["data"])
    assert p.metrics["bf16.speedup_vs_fp32"] == stages["speed"]["bf16"]["speedup_vs_fp32"]
    assert p.metrics["fp32.margin_accuracy_pp"] == stages["details"]["fp32"]["margin_accuracy_pp"]  # once
    assert p.params["evaluate.confidence"] == "0.95" and p.params["prepare.dataset"] == "digits"


def test_each_arm_run_holds_its_own_numbers(stages):
    import mlflow

    from ampbench.runtime.files import dvc_md5

    mlflow.set_tracking_uri(stages["uri"])
    runs = mlflow.search_runs(experiment_names=["ampbench-tests"], output_format="list")
    bf16 = next(r for r in runs if r.info.run_name == "bf16-seed0").data
    metrics, speed = stages["comparison"], stages["speed"]
    assert bf16.params["effective.autocast_dtype"] == "bfloat16"
    assert "prepare.dataset" not in bf16.params and "evaluate.confidence" not in bf16.params  # on the parent
    assert not [k for k in bf16.metrics if k.startswith(("arm.", "fp32."))]  # arm-level values: on the parent
    assert bf16.tags["verdict"] == "inconclusive" and bf16.tags["precision"] == "bf16"
    assert bf16.tags["dvc.data_md5"] == dvc_md5(stages["data"])
    assert bf16.metrics["test_acc"] == pytest.approx(stages["details"]["bf16"]["test_accuracy"], abs=1e-6)
    assert bf16.metrics["d_acc_pp"] == pytest.approx(metrics["bf16"]["delta_accuracy_pp"], abs=1e-3)  # one seed
    assert bf16.metrics["speed_x"] == speed["bf16"]["speedup_vs_fp32"]


def test_ablation_and_diverged_arms_go_through_the_stages(tmp_path, tiny_params, write_params, mlflow_store):
    """Ablations run and are marked; an arm stopped by the divergence guard is FAILED in MLflow and shown as
    diverged (not missing, no NaN results) while the other arms are still evaluated."""
    import mlflow

    tiny_params["train"]["precisions"] = ["fp32", "fp16", "fp16_noscaler", "bf16_pure"]
    tiny_params["train"]["grad_scaler"]["init_scale"] = 2.0**100  # overflows at once: the scale collapses
    tiny_params["train"]["divergence"]["max_consecutive_skips"] = 3
    tiny_params["train"]["telemetry_every"] = 1
    tiny_params["mlflow"]["log_model"] = False
    params = str(write_params(tiny_params))
    data, models, reports = tmp_path / "prepared", tmp_path / "models", tmp_path / "reports"
    runner = CliRunner()
    assert runner.invoke(_stage("prepare"), ["--params", params, "--out", str(data)]).exit_code == 0
    for arm in tiny_params["train"]["precisions"]:
        r = _train(arm, params, data, models)
        assert r.exit_code == 0, r.output + str(r.exception)
    r = runner.invoke(_stage("evaluate"), ["--params", params, "--data", str(data), "--models", str(models),
                                           "--reports", str(reports)])
    assert r.exit_code == 0, r.output + str(r.exception)
    metrics = json.loads((reports / "details.json").read_text())
    assert metrics["fp16"]["status"] == "diverged" and "in a row skipped" in metrics["fp16"]["reason"]
    assert "test_accuracy" not in metrics["fp16"]
    assert metrics["fp16_noscaler"]["status"] == "ok" and metrics["fp16_noscaler"]["ablation"] is True
    assert metrics["bf16_pure"]["ablation"] is True and metrics["fp32"]["ablation"] is False
    assert json.loads((reports / "comparison.json").read_text())["fp16"] == {"verdict": "diverged"}
    table = (reports / "report.md").read_text()
    assert "| fp16 | **diverged**" in table and "| bf16_pure (ablation) |" in table

    mlflow.set_tracking_uri(mlflow_store)
    runs = {r.info.run_name: r for r in mlflow.search_runs(experiment_names=["ampbench-tests"], output_format="list")}
    assert runs["fp16-seed0"].info.status == "FAILED"
    assert "in a row skipped" in runs["fp16-seed0"].data.tags["ampbench.error"]
    assert runs["bf16_pure-seed0"].info.status == "FINISHED"
    (parent,) = [r for r in runs.values() if r.data.tags.get("ampbench.role") == "execution"]
    assert "diverged.fp16" in parent.data.tags
    per_layer = json.loads((models / "fp16_noscaler" / "grad_layers-seed0.json").read_text())
    assert "0.weight" in per_layer[0] and "grad_underflow_frac" in per_layer[0]["0.weight"]


def test_sync_params_check_and_rewrite(tmp_path):
    from ampbench.cli import main

    (tmp_path / "dvc.yaml").write_text((ROOT / "dvc.yaml").read_text())
    from ampbench.config.params import Params
    from ampbench.config.sync import render

    (tmp_path / "params.yaml").write_text(render(Params()))  # not the workspace's: an experiment may have changed it
    runner = CliRunner()
    assert runner.invoke(main, ["sync-params", "--root", str(tmp_path), "--check"]).exit_code == 0
    (tmp_path / "params.yaml").write_text("train:\n  epochs: 2\n")  # no comments, most keys missing
    checked = runner.invoke(main, ["sync-params", "--root", str(tmp_path), "--check"])
    assert checked.exit_code == 1 and "out of date" in checked.output
    assert (tmp_path / "params.yaml").read_text() == "train:\n  epochs: 2\n"  # --check changed nothing
    assert runner.invoke(main, ["sync-params", "--root", str(tmp_path)]).exit_code == 0
    assert "  epochs: 2 " in (tmp_path / "params.yaml").read_text()
    assert runner.invoke(main, ["sync-params", "--root", str(tmp_path), "--check"]).exit_code == 0


def test_time_to_fp32_quality_and_plans_reach_every_output(stages):
    """Issue 26: time to fp32's quality from the validation losses training recorded (four per epoch by default)
    in the report's column, speed.json's rows (details), the plot rows, a figure and MLflow; and every undecided
    verdict's plan in the report and on the runs."""
    import mlflow

    details, report = stages["details"], stages["report"]
    summary = json.loads((stages["models"] / "bf16" / "summary.json").read_text())
    points = summary["seeds"]["0"]["evaluations"]
    # 240 training digits in batches of 32: 8 steps an epoch (the last of 16), so an evaluation every 8 // 4 = 2.
    assert [p["step"] for p in points] == [2, 4, 6, 8] and points[-1]["val_loss"] > 0
    ratio = details["bf16"].get("time_to_fp32_quality_vs_fp32")
    reached = details["bf16"]["seeds_reaching_fp32_quality"]
    assert "| time to fp32 quality × fp32 |" in report and details["fp32"]["time_to_fp32_quality_vs_fp32"] == 1.0
    assert (ratio is not None and f"| {ratio:.2f}× |" in report) or (reached == 0 and "never in 1 of 1 seed" in report)
    rows = json.loads((stages["reports"] / "quality.json").read_text())
    assert {r["run"] for r in rows} == {"fp32-seed0", "bf16-seed0"} and len(rows) == 8
    assert (stages["reports"] / "figures" / "time_to_quality.png").stat().st_size > 10_000
    mlflow.set_tracking_uri(stages["uri"])
    run = next(r for r in mlflow.search_runs(experiment_names=["ampbench-tests"], output_format="list")
               if r.info.run_name == "bf16-seed0")
    history = mlflow.tracking.MlflowClient().get_metric_history(run.info.run_id, "step/val_loss")
    assert [m.step for m in history] == [2, 4, 6, 8]
    if reached:
        assert run.data.metrics["steps_to_fp32_quality"] >= 1
    plans = details["bf16"].get("plans") or []
    undecided = [v for v in (details["bf16"]["not_worse"], details["bf16"]["verdict"]) if v == "inconclusive"]
    assert bool(plans) == bool(undecided)
    if plans:  # one seed: the plan says it cannot tell seed from example variation
        assert "What would decide the verdicts that did not" in report and "planned from 1 seed" in report
        assert run.data.tags["plan"].startswith("bf16, *")
