"""End to end: `dvc repro` of tiny params in a temporary git repo, then reruns, as a user would run them."""

from __future__ import annotations

import json
import os
import shlex
import sys
from pathlib import Path

import pytest
import yaml

from conftest import ROOT, TINY, make_project_repo, run_ok

pytestmark = pytest.mark.slow


def _dvc(*args, repo, env):
    return run_ok([sys.executable, "-m", "dvc", *args], repo, env)


@pytest.fixture(scope="module")
def repo(tmp_path_factory):
    """A fresh git + DVC repo holding this project's pipeline with tiny params, `dvc repro` already run."""
    repo, env = make_project_repo(tmp_path_factory.mktemp("e2e") / "project", TINY)
    out = _dvc("repro", repo=repo, env=env)
    return repo, env, out


def _runs(repo: Path):
    import mlflow

    mlflow.set_tracking_uri(f"sqlite:///{repo / 'mlflow.db'}")
    return mlflow.search_runs(experiment_names=[TINY["mlflow"]["experiment"]], output_format="list")


def test_repro_writes_every_output(repo):
    repo, env, out = repo
    assert "Running stage 'prepare'" in out and "Running stage 'evaluate'" in out
    for arm in TINY["train"]["precisions"]:
        assert (repo / "models" / arm / "summary.json").exists()
    shown = json.loads(_dvc("metrics", "show", "--json", repo=repo, env=env))
    data = next(iter(shown.values()))["data"]
    metrics, speed = data["reports/comparison.json"]["data"], data["reports/speed.json"]["data"]
    assert metrics["fp32"]["verdict"] == "baseline" and speed["fp32"]["speedup_vs_fp32"] == 1.0
    assert set(metrics) == set(TINY["train"]["precisions"]) and set(speed) == {"fp32", "fp16", "bf16"}
    assert metrics["tf32"]["status"] == "skipped"
    for arm in ("fp16", "bf16"):
        assert metrics[arm]["status"] == "ok" and 0 < metrics[arm]["test_accuracy"] <= 1
    _dvc("plots", "show", "-o", "plots_html", repo=repo, env=env)
    html = (repo / "plots_html" / "index.html").read_text()
    assert "val_accuracy" in html and "fp16-seed0" in html
    assert "| fp16 |" in (repo / "reports" / "report.md").read_text()


def test_mlflow_store_at_project_root_with_loadable_models(repo):
    import mlflow.pytorch

    repo, env, _ = repo
    assert (repo / "mlflow.db").exists() and (repo / "mlartifacts").is_dir()
    runs = {r.info.run_name: r for r in _runs(repo)}
    assert set(runs) == {"fp32-seed0", "fp16-seed0", "bf16-seed0", "comparison"}
    for name, run in runs.items():
        assert run.info.status == "FINISHED"
        if name != "comparison":
            assert "test_accuracy" in run.data.metrics and "val_loss" in run.data.metrics
            assert run.data.tags["git_commit"] != "unknown"
    summary = json.loads((repo / "models" / "bf16" / "summary.json").read_text())
    model = mlflow.pytorch.load_model(summary["seeds"]["0"]["model_uri"])
    from ampbench.data import load_prepared

    test = load_prepared(repo / "data" / "prepared").test  # stored uint8; the model takes normalised floats
    assert model(test.inputs(test.x[:5])).shape == (5, 10)


def test_second_repro_does_nothing_and_exp_runs_land_in_the_same_store(repo):
    repo, env, _ = repo
    assert "Data and pipelines are up to date" in _dvc("repro", repo=repo, env=env)
    before = len(_runs(repo))

    out = _dvc("exp", "run", "-S", "train.epochs=2", "-n", "two-epochs", repo=repo, env=env)
    assert "Running stage 'prepare'" not in out
    assert "Running stage 'train@fp32'" in out and "Running stage 'evaluate'" in out
    runs = _runs(repo)
    tagged = [r for r in runs if r.data.tags.get("dvc_exp_name") == "two-epochs"]
    assert len(runs) == before + 4 and len(tagged) == 4  # 3 arms (tf32 skipped) + comparison

    # A temporary-copy experiment (how queued experiments run): its runs still land in the root store.
    out = _dvc("exp", "run", "--temp", "-S", "train.epochs=3", "-n", "in-temp", repo=repo, env=env)
    runs = _runs(repo)
    temp = [r for r in runs if r.data.tags.get("dvc_exp_name") == "in-temp"]
    assert len(temp) == 4 and all(r.info.status == "FINISHED" for r in temp)
    assert not list((repo / ".dvc" / "tmp").rglob("mlflow.db"))

    # Verdict and speed columns in `dvc exp show`, and `ampbench compare` across the two experiments.
    shown = _dvc("exp", "show", "--json", repo=repo, env=env)
    assert '"verdict": "baseline"' in shown and '"speedup_vs_fp32"' in shown
    from ampbench.experiments import compare_revisions, markdown

    result = compare_revisions(["two-epochs", "in-temp"], repo=str(repo))
    assert result["changed_params"] == {"train.epochs": {"two-epochs": 2, "in-temp": 3}}
    assert result["arms"]["fp32"]["in-temp"]["verdict"] == "baseline"
    assert result["arms"]["fp16"]["two-epochs"]["verdict"] == "inconclusive"  # one seed: no interval
    assert "| train.epochs | 2 | 3 |" in markdown(result)


def test_the_readme_factory_example_runs_and_dvc_tracks_its_code(repo):
    """The README's `dvc exp run` line for examples/my_model.py, verbatim; then editing the factory's file makes
    `dvc status` report the train stages as changed."""
    repo, env, _ = repo
    params = yaml.safe_load((repo / "params.yaml").read_text())
    params["train"]["precisions"] = ["fp32", "bf16"]  # time: the command itself is the README's, verbatim
    params["mlflow"]["log_model"] = False
    (repo / "params.yaml").write_text(yaml.safe_dump(params, sort_keys=False))
    lines = (ROOT / "README.md").read_text().splitlines()
    start = next(i for i, line in enumerate(lines) if line.startswith(".venv/bin/dvc exp run -S train.model=examples."))
    command = lines[start]
    while command.endswith("\\"):
        start += 1
        command = command[:-1] + lines[start]
    args = shlex.split(command)
    assert args[:3] == [".venv/bin/dvc", "exp", "run"]
    out = _dvc(*args[1:], repo=repo, env=env)
    assert "Running stage 'train@fp32'" in out and "Running stage 'evaluate'" in out
    summary = json.loads((repo / "models" / "bf16" / "summary.json").read_text())
    assert summary["model"]["name"] == "examples.my_model:build" and summary["model"]["args"] == {
        "channels": 24, "dropout": 0.1}
    assert "Model `examples.my_model:build` (channels=24, dropout=0.1)" in (repo / "reports" / "report.md").read_text()
    assert "Data and pipelines are up to date" in _dvc("status", repo=repo, env=env)

    factory = repo / "examples" / "my_model.py"
    factory.write_text(factory.read_text() + "# an edit\n")
    status = _dvc("status", repo=repo, env=env)
    for stage in ("train@fp32", "train@bf16"):
        assert f"{stage}:" in status
    assert "modified:           examples/my_model.py" in status


def test_dvc_remote_round_trip(tmp_path, tiny_params):
    """Push prepared data, models and reports to a local-directory remote; a fresh clone pulls them and
    `dvc repro` then has nothing to do."""
    tiny_params["train"].update({"precisions": ["fp32", "bf16"]})
    tiny_params["mlflow"]["log_model"] = False
    repo, env = make_project_repo(tmp_path / "origin", tiny_params)
    _dvc("repro", repo=repo, env=env)
    _dvc("remote", "add", "-d", "shared", str(tmp_path / "remote"), repo=repo, env=env)
    run_ok(["git", "add", "-A"], repo, env)
    run_ok(["git", "commit", "-qm", "results and remote"], repo, env)
    assert "pushed" in _dvc("push", repo=repo, env=env)

    clone = tmp_path / "clone"
    run_ok(["git", "clone", "-q", str(repo), str(clone)], tmp_path, env)
    _dvc("pull", repo=clone, env=env)
    assert (clone / "models" / "bf16" / "seed0.pt").exists() and (clone / "data" / "prepared" / "meta.json").exists()
    assert "Data and pipelines are up to date" in _dvc("status", repo=clone, env=env)
    out = _dvc("repro", repo=clone, env=env)
    assert "Running stage" not in out and "Data and pipelines are up to date" in out


FASHION = Path("/usr/share/datasets/fashion-mnist")


@pytest.mark.skipif(not FASHION.is_dir() and not os.environ.get("AMPBENCH_REQUIRE_FASHION_MNIST"),
                    reason="Debian's dataset-fashion-mnist is not installed (CI installs it)")
def test_real_fashion_mnist_from_debians_files(tmp_path, tiny_params, write_params, mlflow_store):
    """prepare → train (fp32, fp16, bf16; one seed, one short epoch, streamed) → evaluate on real Fashion-MNIST,
    read straight from the package's .gz files."""
    from click.testing import CliRunner

    from ampbench.data import load_prepared
    from test_cli import _stage, _train

    params = tiny_params
    # Capped for CI's time: 2,000 training images, 1,200 for validation, 2,000 for the test (fp16 on a CPU is slow).
    params["prepare"] = {"dataset": "fashion_mnist", "raw_dir": str(FASHION), "max_train": 2000, "max_test": 2000,
                         "val_fraction": 0.02}
    params["train"].update({"precisions": ["fp32", "fp16", "bf16"], "seeds": [0], "epochs": 1, "batch_size": 100,
                            "lr": 0.01, "data_on_device": False, "loader_workers": 2})
    params["mlflow"]["log_model"] = False
    path = str(write_params(params))
    data, models, reports = tmp_path / "prepared", tmp_path / "models", tmp_path / "reports"
    r = CliRunner().invoke(_stage("prepare"), ["--params", path, "--out", str(data)])
    assert r.exit_code == 0, r.output
    prepared = load_prepared(data)
    assert prepared.meta["sizes"] == {"train": 2000, "val": 1200, "test": 2000}
    assert prepared.meta["classes"][9] == "Ankle boot"
    for arm in params["train"]["precisions"]:
        r = _train(arm, path, data, models)
        assert r.exit_code == 0, r.output + str(r.exception)
        summary = json.loads((models / arm / "summary.json").read_text())
        assert summary["input_path"] == "streaming DataLoader" and summary["optimizer_steps"] == 20
    r = CliRunner().invoke(_stage("evaluate"), ["--params", path, "--data", str(data), "--models", str(models),
                                                "--reports", str(reports)])
    assert r.exit_code == 0, r.output + str(r.exception)
    comparison = json.loads((reports / "comparison.json").read_text())
    assert comparison["fp32"]["test_accuracy"] > 0.4  # 20 steps on 2,000 images: 4× chance (0.1); 0.54 seen
    for arm in ("fp16", "bf16"):
        assert comparison[arm]["paired_examples"] == 2000 and comparison[arm]["verdict"] != "invalid"
    assert "waiting for batches" in (reports / "report.md").read_text()
