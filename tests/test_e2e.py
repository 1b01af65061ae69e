"""End to end: `dvc repro` of tiny params in a temporary git repo, then reruns, as a user would run them."""

from __future__ import annotations

import json
import os
import sys
from pathlib import Path

import pytest
import yaml

from conftest import ROOT, TINY, link_venv, make_project_repo, run_ok

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
    assert metrics["fp32"]["verdict"] == "baseline" and speed["fp32"]["samples_per_s"] > 0
    assert set(metrics) == set(TINY["train"]["precisions"]) and set(speed) == {"fp32", "fp16", "bf16"}
    assert metrics["tf32"] == {"verdict": "skipped"}
    for arm in ("fp16", "bf16"):
        assert metrics[arm]["verdict"] != "skipped" and metrics[arm]["not_worse"] in ("not worse", "worse",
                                                                                       "inconclusive")
    columns = sum(len(row) for table in (metrics, speed) for row in table.values())
    assert columns <= 25, f"{columns} metric columns in `dvc exp show`"
    # Without a terminal (here: a pipe) training still says how it goes, one line per epoch.
    assert "[fp16] seed 0 epoch 1/1: train_loss " in out and "left for this arm" in out
    assert "| fp16 |" in (repo / "reports" / "report.md").read_text()


def test_plots_page_works_offline(repo, tmp_path):
    """`dvc plots show` writes a page with vega inlined (no script from the network), one panel per curve of
    dvc.yaml (no raw panel of curves.json itself), and whole-number epochs on the x axis."""
    import re

    repo, env, _ = repo
    _dvc("plots", "show", "-o", str(tmp_path / "plots_html"), repo=repo, env=env)
    html = (tmp_path / "plots_html" / "index.html").read_text()
    assert not re.findall(r"<script[^>]+src=", html) and "cdn.jsdelivr" not in html
    assert "vega-embed 6.29.0" in html and "vegaEmbed(" in html
    panels = re.findall(r'<div id = "([^"]+)">', html)
    wanted = yaml.safe_load((ROOT / "dvc.yaml").read_text())["plots"]
    assert len(panels) == len(wanted) == 9 and not [p for p in panels if "curves" in p], panels
    assert "time_to_fp32_quality" in panels  # validation loss against time (issue 26)
    assert "fp16-seed0" in html and '"tickMinStep": 1' in html and '"format": "d"' in html


def test_mlflow_store_at_project_root_with_loadable_models(repo):
    import mlflow.pytorch

    repo, env, _ = repo
    assert (repo / "mlflow.db").exists() and (repo / "mlartifacts").is_dir()
    runs = {r.info.run_name: r for r in _runs(repo)}
    (parent,) = [r for r in runs.values() if r.data.tags["ampbench.role"] == "execution"]
    assert set(runs) == {"fp32-seed0", "fp16-seed0", "bf16-seed0", parent.info.run_name}
    lock = yaml.safe_load((repo / "dvc.lock").read_text())
    data_md5 = next(o["md5"] for o in lock["stages"]["prepare"]["outs"] if o["path"] == "data/prepared")
    assert parent.data.tags["dvc.data_md5"] == data_md5  # the prepared data's DVC hash
    for run in runs.values():
        assert run.info.status == "FINISHED"
        if run is not parent:
            assert run.data.tags["mlflow.parentRunId"] == parent.info.run_id
            assert {"test_acc", "d_acc_pp", "val_loss"} <= set(run.data.metrics) and "verdict" in run.data.tags
            assert run.data.tags["git_commit"] != "unknown" and run.data.tags["dvc.data_md5"] == data_md5
            assert run.inputs.dataset_inputs[0].dataset.digest == data_md5  # the Dataset column shows it too
    summary = json.loads((repo / "models" / "bf16" / "summary.json").read_text())
    model = mlflow.pytorch.load_model(summary["seeds"]["0"]["model_uri"])
    from ampbench.data.prepare import load_prepared

    test = load_prepared(repo / "data" / "prepared").test  # stored uint8; the model takes normalised floats
    assert model(test.inputs(test.x[:5])).shape == (5, 10)
    # As a pyfunc too, the way `mlflow models serve` loads it (the stage skips MLflow's own serving check).
    served = mlflow.pyfunc.load_model(summary["seeds"]["0"]["model_uri"])
    assert served.predict(test.inputs(test.x[:2]).numpy()).shape == (2, 10)


def test_pages_render_in_headless_chromium(repo, tmp_path):
    """What the README shows, rendered as a user sees it (scripts/ui_check.py): `dvc plots show`'s page, opened
    offline, draws every plot of dvc.yaml; the MLflow UI's runs table lists the execution's parent run, the arm
    runs under it, and takes the README's columns (test_acc, d_acc_pp, speed_x, verdict)."""
    import importlib.util

    spec = importlib.util.spec_from_file_location("ui_check", ROOT / "scripts" / "ui_check.py")
    ui_check = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(ui_check)
    if ui_check.browser() is None:
        if os.environ.get("AMPBENCH_REQUIRE_CHROMIUM"):
            pytest.fail("AMPBENCH_REQUIRE_CHROMIUM is set but no Chromium is installed")
        pytest.skip("no Chromium (Debian: apt-get install chromium; .ci/run installs it)")
    repo, env, _ = repo
    runs = _runs(repo)
    (parent,) = [r for r in runs if r.data.tags["ampbench.role"] == "execution"]
    assert ui_check.check_plots_page(repo, tmp_path / "plots.png") == []
    children = [r.info.run_name for r in runs if r is not parent]
    assert ui_check.check_runs_table(repo, [parent.info.run_name], children, tmp_path / "runs.png", env=env) == []
    assert (tmp_path / "plots.png").stat().st_size > 20_000 and (tmp_path / "runs.png").stat().st_size > 20_000


def test_a_fresh_clone_reproduces_the_committed_metrics_and_pulls_the_rest(repo, tmp_path):
    """Commit the `dvc repro` (dvc.lock, reports/comparison.json): a fresh clone's own `dvc repro` gives the same
    comparison.json, byte for byte. Then push the outputs to a local-directory remote: another clone pulls them and
    `dvc repro` has nothing to do."""
    import yaml as _yaml

    repo, env, _ = repo
    run_ok(["git", "add", "-A"], repo, env)
    run_ok(["git", "commit", "-qm", "results"], repo, env)
    clone = tmp_path / "clone"
    run_ok(["git", "clone", "-q", str(repo), str(clone)], tmp_path, env)
    _dvc("repro", repo=clone, env=link_venv(clone, env))  # a clone gets its own set-up (`make install`)
    committed = (repo / "reports" / "comparison.json").read_text()
    assert (clone / "reports" / "comparison.json").read_text() == committed

    def lock(root: Path) -> dict[str, str]:
        outs = _yaml.safe_load((root / "dvc.lock").read_text())["stages"]["evaluate"]["outs"]
        return {o["path"]: o["md5"] for o in outs}

    assert lock(clone)["reports/comparison.json"] == lock(repo)["reports/comparison.json"]
    assert "reports/comparison.json" not in run_ok(["git", "status", "--porcelain"], clone, env)

    _dvc("remote", "add", "-d", "shared", str(tmp_path / "remote"), repo=repo, env=env)
    run_ok(["git", "commit", "-qam", "a remote"], repo, env)
    assert "pushed" in _dvc("push", repo=repo, env=env)
    pulled = tmp_path / "pulled"
    run_ok(["git", "clone", "-q", str(repo), str(pulled)], tmp_path, env)
    _dvc("pull", repo=pulled, env=env)
    assert (pulled / "models" / "bf16" / "seed0.pt").exists() and (pulled / "data" / "prepared" / "meta.json").exists()
    assert "Data and pipelines are up to date" in _dvc("status", repo=pulled, env=env)
    out = _dvc("repro", repo=pulled, env=env)
    assert "Running stage" not in out and "Data and pipelines are up to date" in out


def test_second_repro_does_nothing_and_exp_runs_land_in_the_same_store(repo):
    """The README's `dvc exp run` line (a temporary copy) and `dvc exp show` line, verbatim, without an activated
    venv; a named workspace experiment; both in the root store, each under a parent named after it."""
    import re

    repo, env, _ = repo
    assert "Data and pipelines are up to date" in _dvc("repro", repo=repo, env=env)
    before, committed = len(_runs(repo)), (repo / "params.yaml").read_text()
    # `ampbench fix`'s records are the evaluate stage's input (read into report.md): a new one reruns it alone
    record = repo / "reports" / "fix" / "bf16.json"
    record.write_text("{}")
    status = _dvc("status", repo=repo, env=env)
    assert re.findall(r"^(\S+):$", status, re.M) == ["evaluate"] and "reports/fix" in status, status
    record.unlink()

    # A temporary copy (how queued experiments run too): the workspace's params stay, the runs land in the root store.
    out = _run_readme(_readme_command(".venv/bin/dvc exp run --temp -S 'train.precisions=[fp32,bf16]'"), repo, env)
    assert "Running stage 'train@bf16'" in out and "Running stage 'evaluate'" in out
    assert (repo / "params.yaml").read_text() == committed
    temp = re.search(r"Ran experiment\(s\): (\S+)", out).group(1)
    runs = [r for r in _runs(repo) if r.data.tags.get("dvc.exp_name") == temp]
    assert {r.info.run_name for r in runs} >= {f"bf16-seed{s}" for s in range(5)}
    assert len(runs) == 11 and all(r.info.status == "FINISHED" for r in runs)  # 2 arms × 5 seeds + the parent
    assert not list((repo / ".dvc" / "tmp").rglob("mlflow.db"))

    out = _dvc("exp", "run", "-S", "train.precisions=[fp32]", "-S", "train.epochs=2", "-n", "two-epochs",
               repo=repo, env=env)
    assert "Running stage 'prepare'" not in out and "Running stage 'train@fp32'" in out
    runs = _runs(repo)
    tagged = [r for r in runs if r.data.tags.get("dvc.exp_name") == "two-epochs"]
    assert len(runs) == before + 11 + 2 and len(tagged) == 2  # one arm + its parent, named after the experiment
    (parent,) = [r for r in tagged if r.data.tags["ampbench.role"] == "execution"]
    assert parent.info.run_name == "two-epochs" and parent.data.tags["verdict.fp32"] == "baseline"
    assert all(r.data.tags["mlflow.parentRunId"] == parent.info.run_id for r in tagged if r is not parent)

    # Verdict and speed columns in `dvc exp show`, and `ampbench compare` across the two experiments.
    # Issue 29.4: the README's line fits 160 columns (a plain `dvc exp show` printed 1,586-character lines).
    shown = _run_readme(_readme_command(".venv/bin/dvc exp show --drop"), repo, env)
    assert "bf16.not_worse" in shown and "bf16.speedup_vs_fp32" in shown and "train.lr" not in shown
    assert temp in shown and "two-epochs" in shown
    assert max(len(line) for line in shown.splitlines()) <= 160, shown
    shown = _dvc("exp", "show", "--json", repo=repo, env=env)
    assert '"verdict": "baseline"' in shown and '"speedup_vs_fp32"' in shown and '"agreement_vs_fp32"' not in shown
    from ampbench.report.experiments import compare_revisions, markdown

    result = compare_revisions(["two-epochs", temp], repo=str(repo))
    assert set(result["changed_params"]) == {"train.epochs", "train.precisions", "train.seeds"}
    assert result["changed_params"]["train.epochs"] == {"two-epochs": 2, temp: 1}
    assert result["arms"]["fp32"][temp]["verdict"] == result["arms"]["fp32"]["two-epochs"]["verdict"] == "baseline"
    assert result["arms"]["bf16"]["two-epochs"]["verdict"] is None  # not trained in that experiment
    assert "| train.epochs | 2 | 1 |" in markdown(result)
    run_ok(["git", "checkout", "--", "params.yaml"], repo, env)  # the workspace experiment changed it


def _dvc_fails(*args, repo, env) -> str:
    import subprocess

    proc = subprocess.run([sys.executable, "-m", "dvc", *args], cwd=repo, env=env, capture_output=True, text=True)
    assert proc.returncode != 0, proc.stdout + proc.stderr
    return proc.stdout + proc.stderr


def test_dvcs_own_suggestion_for_a_typo_stops_at_the_check_stage(repo):
    """Issue 29.3: `-S train.epoch=2` makes DVC suggest `+train.epoch=2`, which adds the key; no stage reads
    train.epoch, so without the check stage every stage "didn't change" and an experiment that did nothing was
    recorded. The check stage depends on every section, so it reruns and stops with the unknown-key line."""
    repo, env, _ = repo
    committed = (repo / "params.yaml").read_text()
    out = _dvc_fails("exp", "run", "--temp", "-S", "+train.epoch=2", repo=repo, env=env)
    assert "train.epoch: unknown key (a typo?); did you mean train.epochs?" in out
    assert "Running stage 'prepare'" not in out and "Running stage 'train" not in out
    assert (repo / "params.yaml").read_text() == committed


def test_an_untracked_model_file_is_named_with_the_git_add_that_fixes_it(repo):
    """Issue 29.4: a temporary experiment's copy holds only git-tracked files; the check stage says so for a
    train.model_code that exists in the project but not in the copy, instead of DVC's missing-file error."""
    repo, env, _ = repo
    code = repo / "mymodels" / "net.py"
    code.parent.mkdir()
    code.write_text("import torch\n\ndef build(num_classes, in_channels, **kw):\n"
                    "    return torch.nn.Sequential(torch.nn.Flatten(), torch.nn.LazyLinear(num_classes))\n")
    try:
        out = _dvc_fails("exp", "run", "--temp", "-S", "train.model=mymodels.net:build", "-S",
                         "train.model_code=mymodels/net.py", repo=repo, env=env)
    finally:
        code.unlink()
        code.parent.rmdir()
    assert ("train.model_code: mymodels/net.py is in your project but not in the copy DVC made for this experiment"
            in out and "`git add mymodels/net.py`" in out)
    assert "Running stage 'prepare'" not in out


def test_a_temporary_experiment_keeps_its_artifacts_in_a_new_user_store(repo, tmp_path):
    """Issue 14.3: `dvc exp run --temp` (a temporary copy, as queued experiments use) against a new store named by
    MLFLOW_TRACKING_URI: the experiment's artifact location is beside the store, and every artifact is still there
    after DVC deleted the copy."""
    from mlflow.tracking import MlflowClient

    repo, env, _ = repo
    uri = f"sqlite:///{tmp_path / 'shared' / 'team.db'}"
    # A learning rate no other test uses, so DVC's run cache cannot restore the arm instead of training it.
    _dvc("exp", "run", "--temp", "-S", "train.precisions=[fp32]", "-S", "train.lr=0.0021", repo=repo,
         env={**env, "MLFLOW_TRACKING_URI": uri})
    client = MlflowClient(uri)
    exp = client.get_experiment_by_name(TINY["mlflow"]["experiment"])
    assert exp.artifact_location == (tmp_path / "shared" / "mlartifacts").as_uri()
    runs = client.search_runs([exp.experiment_id])
    assert {r.info.run_name for r in runs} >= {"fp32-seed0"}
    for r in runs:
        folder = Path(r.info.artifact_uri.removeprefix("file://"))
        assert folder.is_dir() and any(folder.rglob("*")), f"{r.info.run_name}: artifacts gone from {folder}"


FORTUNES = Path("/usr/share/games/fortunes")


@pytest.mark.skipif(not FORTUNES.is_dir() and not os.environ.get("AMPBENCH_REQUIRE_FORTUNES"),
                    reason="Debian's fortunes is not installed (CI installs it)")
def test_a_language_model_on_debians_fortunes_text(repo):
    """docs/language-models.md's command on the real text, sized for CI (a tiny gpt, one short pass, every CPU
    arm): the verdicts are the loss's, per token, in `dvc exp show` and on the experiment's MLflow parent run."""
    import re

    repo, env, _ = repo
    out = _dvc("exp", "run", "--temp", "-S", "train.task=language_model", "-S", "prepare.dataset=text",
               "-S", f"prepare.raw_dir={FORTUNES}", "-S", "train.model=gpt", "-S", "prepare.max_train=20001",
               "-S", "prepare.max_test=4001", "-S", "prepare.val_fraction=0.01", "-S", "train.width=16",
               "-S", "++train.model_args={depth: 1, heads: 2}", "-S", "train.block_size=32", repo=repo, env=env)
    assert "Running stage 'train@fp16'" in out and "Running stage 'evaluate'" in out
    name = re.search(r"Ran experiment\(s\): (\S+)", out).group(1)
    runs = [r for r in _runs(repo) if r.data.tags.get("dvc.exp_name") == name]
    (parent,) = [r for r in runs if r.data.tags["ampbench.role"] == "execution"]
    assert {r.info.run_name for r in runs if r is not parent} == {"fp32-seed0", "fp16-seed0", "bf16-seed0"}
    assert parent.data.tags["verdict.tf32"] == "skipped" and parent.data.tags["verdict.bf16"] != "skipped"
    assert 1 < parent.data.metrics["fp32.perplexity"] < 256  # below a uniform guess over the bytes
    shown = _dvc("exp", "show", "--json", repo=repo, env=env)
    assert '"delta_loss_bound"' in shown and '"perplexity"' in shown


def _readme_command(prefix: str) -> str:
    """The first command line starting with ``prefix`` in README.md, else in docs/*.md (by name), continuation lines
    joined: the commands the README and the docs pages show, as written."""
    for page in [ROOT / "README.md", *sorted((ROOT / "docs").glob("*.md"))]:
        lines = page.read_text().splitlines()
        start = next((i for i, line in enumerate(lines) if line.startswith(prefix)), None)
        if start is None:
            continue
        command = lines[start]
        while command.endswith("\\"):
            start += 1
            command = command[:-1] + lines[start]
        return command
    raise AssertionError(f"no line starting with {prefix!r} in README.md or docs/*.md")


def _run_readme(command: str, repo: Path, env: dict) -> str:
    """Run a README line as a user would paste it: bash, in the project, PATH without the venv (not activated)."""
    if not (repo / ".venv").exists():
        pytest.skip("the tests do not run from a venv, so the project has no .venv for the README's commands")
    assert str(Path(sys.prefix) / "bin") not in env["PATH"].split(os.pathsep)
    return run_ok(["bash", "-c", command], repo, env)


def test_the_readme_factory_example_runs_and_dvc_tracks_its_code(repo):
    """The README's `dvc exp run` line for examples/my_model.py, verbatim, in a temporary copy; `dvc exp apply`
    brings it into the workspace; then editing the factory's file makes `dvc status` report the train stages."""
    import re

    import mlflow

    repo, env, _ = repo
    params = yaml.safe_load((repo / "params.yaml").read_text())
    params["train"]["precisions"] = ["fp32"]  # time: the command itself is the README's, verbatim
    params["mlflow"]["log_model"] = False
    (repo / "params.yaml").write_text(yaml.safe_dump(params, sort_keys=False))
    run_ok(["git", "commit", "-qam", "one arm"], repo, env)
    before = (repo / "params.yaml").read_text()
    command = _readme_command(".venv/bin/dvc exp run --temp -S train.model=examples.")
    out = _run_readme(command, repo, env)
    assert "Running stage 'train@fp32'" in out and "Running stage 'evaluate'" in out
    assert (repo / "params.yaml").read_text() == before  # --temp: the workspace's params are left alone
    name = re.search(r"Ran experiment\(s\): (\S+)", out).group(1)

    runs = _runs(repo)
    (parent,) = [r for r in runs if r.data.tags.get("dvc.exp_name") == name and r.data.tags["ampbench.role"]
                 == "execution"]
    report = Path(mlflow.artifacts.download_artifacts(run_id=parent.info.run_id, artifact_path="report.md"))
    assert "Model `examples.my_model:build` (channels=24, dropout=0.1)" in report.read_text()

    _run_readme(f".venv/bin/dvc exp apply {name}", repo, env)
    summary = json.loads((repo / "models" / "fp32" / "summary.json").read_text())
    assert summary["model"]["name"] == "examples.my_model:build" and summary["model"]["args"] == {
        "channels": 24, "dropout": 0.1}
    assert "Data and pipelines are up to date" in _dvc("status", repo=repo, env=env)

    factory = repo / "examples" / "my_model.py"
    factory.write_text(factory.read_text() + "# an edit\n")
    status = _dvc("status", repo=repo, env=env)
    assert "train@fp32:" in status and "evaluate:" in status
    assert "modified:           examples/my_model.py" in status
    factory.write_text(factory.read_text().replace("# an edit\n", ""))
    run_ok(["git", "checkout", "--", "."], repo, env)  # back to the committed one-arm params


FASHION = Path("/usr/share/datasets/fashion-mnist")


@pytest.mark.skipif(not FASHION.is_dir() and not os.environ.get("AMPBENCH_REQUIRE_FASHION_MNIST"),
                    reason="Debian's dataset-fashion-mnist is not installed (CI installs it)")
def test_real_fashion_mnist_from_debians_files(tmp_path, tiny_params, write_params, mlflow_store):
    """prepare → train (fp32, bf16; one seed, one short epoch, streamed) → evaluate on real Fashion-MNIST, read
    straight from the package's .gz files. Not fp16: its CPU autocast runs 0.01–0.2× fp32 (about 4 s a step of 100
    28×28 images on a 2-core Xeon, 80 s of this test); fp16 through the same stages is tested on digits."""
    from click.testing import CliRunner

    from ampbench.data.prepare import load_prepared
    from test_cli import _stage, _train

    params = tiny_params
    # Capped for CI's time: 2,000 training images, 1,200 for validation, 2,000 for the test (fp16 on a CPU is slow).
    params["prepare"] = {"dataset": "fashion_mnist", "raw_dir": str(FASHION), "max_train": 2000, "max_test": 2000,
                         "val_fraction": 0.02}
    params["train"].update({"precisions": ["fp32", "bf16"], "seeds": [0], "epochs": 1, "batch_size": 100,
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
    comparison = json.loads((reports / "details.json").read_text())  # every number (comparison.json: a few)
    assert comparison["fp32"]["test_accuracy"] > 0.4  # 20 steps on 2,000 images: 4× chance (0.1); 0.54 seen
    assert comparison["bf16"]["paired_examples"] == 2000 and comparison["bf16"]["verdict"] != "invalid"
    assert "waiting for batches" in (reports / "report.md").read_text()
