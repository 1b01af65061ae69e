"""The language-model task: byte-level text, the built-in gpt, the task's loss and metrics, and the whole pipeline
(prepare → train → evaluate) on text the tests write; bad text and mismatched models stop with one line."""

from __future__ import annotations

import json
import math
import os
import random
from pathlib import Path

import pytest
import torch
import yaml
from click.testing import CliRunner

from ampbench.data.text import read_tokens, sequences, split_by_position
from ampbench.errors import DataError
from ampbench.models.gpt import build as build_gpt
from ampbench.precision.policy import resolve_policy
from ampbench.tasks.language_model import LanguageModel
from conftest import QUICK_SPEED, TINY, torch_flags_restored
from test_cli import _stage

CPU = torch.device("cpu")


def corpus(sentences: int = 600, seed: int = 0) -> str:
    """Learnable English-like text: short sentences from a small grammar (a model can learn its bytes)."""
    rng = random.Random(seed)
    subjects = ["the cat", "a dog", "my friend", "the old man", "a small bird", "our teacher"]
    verbs = ["sees", "likes", "finds", "wants", "eats", "draws"]
    objects = ["the fish", "a ball", "some bread", "the red car", "a small box", "the moon"]
    return "".join(f"{rng.choice(subjects)} {rng.choice(verbs)} {rng.choice(objects)}. " for _ in range(sentences))


def write_text_folder(folder: Path) -> Path:
    """A folder as Debian's fortunes lays it out: text files, a binary index beside each, a link to one."""
    folder.mkdir(parents=True, exist_ok=True)
    (folder / "a").write_text(corpus(400, 0))
    (folder / "b").write_text(corpus(200, 1))
    (folder / "a.dat").write_bytes(b"\x00\x00\x00\x02binary index\x00\xff")
    (folder / "a.u8").symlink_to("a")
    (folder / ".hidden").write_text("never read")
    return folder


def test_a_text_folder_is_read_once_per_file_skipping_binaries_links_and_hidden_files(tmp_path):
    tokens, read = read_tokens(write_text_folder(tmp_path / "raw"))
    assert read == {"files": 2, "binary_files_skipped": 1, "bytes": len(tokens)}
    assert bytes(tokens.tolist()) == (corpus(400, 0) + corpus(200, 1)).encode()
    assert tokens.dtype == torch.uint8


@pytest.mark.parametrize("content, expected", [(b"caf\xe9 au lait\n", r"not UTF-8 text \(byte 3"),
                                               (b"   \n\t\n", "is empty")])
def test_bad_text_is_one_line_naming_the_file(tmp_path, content, expected):
    (tmp_path / "raw").mkdir()
    (tmp_path / "raw" / "notes.txt").write_bytes(content)
    with pytest.raises(DataError, match=expected) as err:
        read_tokens(tmp_path / "raw")
    assert "\n" not in str(err.value)


def test_the_split_is_by_position_and_sequences_are_shifted_views():
    tokens = torch.arange(200, dtype=torch.uint8)
    parts = split_by_position(tokens, 0.1, 0.2)
    assert [len(parts[k]) for k in ("train", "val", "test")] == [140, 20, 40]
    assert parts["train"][-1] + 1 == parts["val"][0] and parts["val"][-1] + 1 == parts["test"][0]
    x, y = sequences(parts["train"], 16)
    assert x.shape == y.shape == (8, 16)  # (140 − 1) // 16 whole sequences
    assert torch.equal(y[:, :-1], x[:, 1:]) and torch.equal(y[0], torch.arange(1, 17, dtype=torch.uint8))
    assert x.data_ptr() == parts["train"].data_ptr()  # a view: no copy of the text


def test_gpt_is_causal_and_ties_its_head():
    torch.manual_seed(0)
    model = build_gpt(256, 16, 32, depth=2, heads=4).eval()
    idx = torch.randint(0, 256, (2, 16))
    out = model(idx)
    assert out.shape == (2, 16, 256)
    changed = idx.clone()
    changed[:, 10:] = (changed[:, 10:] + 1) % 256  # later tokens cannot change earlier predictions
    assert torch.allclose(model(changed)[:, :10], out[:, :10]) and not torch.allclose(model(changed), out)
    assert model.head.weight is model.tok.weight
    assert {n for n, _ in model.named_modules()} >= {"blocks.0.attn", "blocks.1.mlp", "head"}
    with pytest.raises(ValueError, match="longer than the model's 16 positions"):
        model(torch.zeros(1, 17, dtype=torch.long))


def test_loss_accuracy_and_validation_are_per_token():
    task = LanguageModel(block_size=8)
    logits = torch.randn(3, 8, 256)
    y = torch.randint(0, 256, (3, 8), dtype=torch.uint8)
    expected = torch.nn.functional.cross_entropy(logits.reshape(24, 256), y.reshape(24).long())
    assert torch.allclose(task.loss(logits, y), expected)
    right, units = task.correct(logits, y)
    assert units == 24 and right.item() == (logits.argmax(-1) == y).sum().item()
    # Validation streams batches and still gives the mean over every token of the split.
    torch.manual_seed(0)
    model = build_gpt(256, 8, 16, depth=1, heads=2)
    tokens = torch.tensor(list(corpus(20).encode()), dtype=torch.uint8)
    split = task.view_split(tokens)
    policy = resolve_policy("fp32", CPU)
    loss, acc = task.validate(model, split, policy, batch_size=3)
    with torch.no_grad():
        full = model(split.inputs(split.x))
    assert loss == pytest.approx(task.loss(full, split.y).item(), rel=1e-5)
    assert acc == pytest.approx((full.argmax(-1) == split.y).float().mean().item())


def _lm_params(raw: Path, **train) -> dict:
    params = yaml.safe_load(yaml.safe_dump(TINY))
    params["prepare"].update({"dataset": "text", "raw_dir": str(raw), "max_train": None})
    params["train"].update({"task": "language_model", "model": "gpt", "width": 16, "model_args": {"depth": 1,
                            "heads": 2}, "block_size": 16, "batch_size": 32, "lr": 0.003, "scheduler": "constant",
                            "precisions": ["fp32", "bf16"], "seeds": [0, 1], **train})
    params["mlflow"]["log_model"] = False
    return params


def _invoke_stage(name: str, args: list[str], uri: str):
    with pytest.MonkeyPatch.context() as mp, torch_flags_restored():
        mp.setenv("MLFLOW_TRACKING_URI", uri)
        return CliRunner().invoke(_stage(name), args)


def _stages(tmp: Path, params: dict, arms: list[str]) -> dict:
    """prepare → train ``arms`` → evaluate in this process under ``tmp``; the comparison and details."""
    path = tmp / "params.yaml"
    path.write_text(yaml.safe_dump(params))
    data, models, reports = tmp / "prepared", tmp / "models", tmp / "reports"
    uri = f"sqlite:///{tmp / 'mlflow.db'}"
    r = _invoke_stage("prepare", ["--params", str(path), "--out", str(data)], uri)
    assert r.exit_code == 0, r.output
    for arm in arms:
        r = _invoke_stage("train", ["--precision", arm, "--params", str(path), "--data", str(data), "--out",
                                    str(models / arm), "--resume-dir", str(tmp / ".resume" / arm)], uri)
        assert r.exit_code == 0, r.output + repr(r.exception)
    r = _invoke_stage("evaluate", ["--params", str(path), "--data", str(data), "--models", str(models),
                                   "--reports", str(reports)], uri)
    assert r.exit_code == 0, r.output + repr(r.exception)
    return {name: json.loads((reports / f"{name}.json").read_text()) for name in ("comparison", "details")} | {
        "history": json.loads((models / "fp32" / "history.json").read_text())["seeds"]["0"]}


@pytest.fixture(scope="module")
def lm_run(tmp_path_factory):
    """prepare → train (fp32, bf16; 2 seeds) → evaluate on the tests' text, in this process; validation capped."""
    tmp = tmp_path_factory.mktemp("lm")
    params = _lm_params(write_text_folder(tmp / "raw"))
    params["prepare"]["max_val"] = 1001  # of about 2,400 tokens: the report says the cut
    out = _stages(tmp, params, ["fp32", "bf16"])
    return {**out, "data": tmp / "prepared", "models": tmp / "models", "uri": f"sqlite:///{tmp / 'mlflow.db'}",
            "report": (tmp / "reports" / "report.md").read_text()}


def test_the_pipeline_trains_and_judges_a_language_model_by_its_loss(lm_run):
    meta = json.loads((lm_run["data"] / "meta.json").read_text())
    assert meta["kind"] == "tokens" and meta["vocab_size"] == 256 and meta["binary_files_skipped"] == 1
    comparison, details = lm_run["comparison"], lm_run["details"]
    # The DVC columns are the loss's: nats per token, and perplexity for the baseline.
    assert set(comparison["fp32"]) == {"verdict", "test_loss", "perplexity", "margin_loss"}
    assert comparison["fp32"]["perplexity"] == pytest.approx(math.exp(comparison["fp32"]["test_loss"]), rel=1e-4)
    assert set(comparison["bf16"]) >= {"not_worse", "verdict", "delta_loss", "delta_loss_bound"}
    assert comparison["bf16"]["verdict"] in ("equivalent", "inconclusive", "worse", "better")
    assert details["bf16"]["verdict"] == details["bf16"]["loss_verdict"]  # the loss decides
    assert details["bf16"]["not_worse"] == details["bf16"]["loss_not_worse"] in ("not worse", "worse", "inconclusive")
    assert details["bf16"]["accuracy_not_worse"] in ("not worse", "worse", "inconclusive")
    assert details["bf16"]["delta_loss_bound"] <= details["bf16"]["delta_loss_ci_high"]  # one-sided: the upper
    assert details["bf16"]["accuracy_verdict"] in ("equivalent", "inconclusive", "worse", "better")
    # Sequences are the paired examples: 2 seeds × the test split's sequences.
    n_test = (meta["sizes"]["test"] - 1) // 16
    assert details["bf16"]["statistics"]["loss"]["interval"]["pairs"] == 2 * n_test
    # Δloss is the arm's loss per token minus fp32's (to the files' rounding).
    assert details["bf16"]["test_loss"] - comparison["fp32"]["test_loss"] == pytest.approx(
        comparison["bf16"]["delta_loss"], abs=2e-6)
    assert details["fp32"]["test_loss"] < math.log(256)  # it learned something: below a uniform guess
    report = lm_run["report"]
    assert "Δloss, nats/token" in report and "next-token accuracy" in report and "| bf16 |" in report


def test_a_capped_validation_split_is_recorded_and_said_in_the_reports_data_sentence(lm_run):
    meta = json.loads((lm_run["data"] / "meta.json").read_text())
    assert meta["sizes"]["val"] == 1001 and meta["val_available"] > 2000  # the size before prepare.max_val
    data = next(line for line in lm_run["report"].splitlines() if line.startswith("Data `text`"))
    assert f"validation to 1,001 of {meta['val_available']:,} tokens (prepare.max_val)" in data, data


def test_the_language_model_runs_are_in_mlflow_with_loss_per_token_curves(lm_run):
    import mlflow

    mlflow.set_tracking_uri(lm_run["uri"])
    runs = mlflow.search_runs(experiment_names=[TINY["mlflow"]["experiment"]], output_format="list")
    arm_runs = [r for r in runs if r.data.tags.get("ampbench.role") == "arm"]
    assert {r.info.run_name for r in arm_runs} == {f"{a}-seed{s}" for a in ("fp32", "bf16") for s in (0, 1)}
    bf16 = next(r for r in arm_runs if r.info.run_name == "bf16-seed0")
    assert bf16.data.params["train.task"] == "language_model" and bf16.data.tags["verdict"]
    assert 0 < bf16.data.metrics["val_loss"] < math.log(256) and 0 < bf16.data.metrics["val_accuracy"] < 1
    history = json.loads((lm_run["models"] / "bf16" / "history.json").read_text())["seeds"]["0"]
    assert history[0]["train_loss"] > 0 and history[0]["optimizer_steps"] > 0


def test_attention_is_where_the_activation_table_and_fp32_modules_can_point(lm_run):
    summary = json.loads((lm_run["models"] / "fp32" / "summary.json").read_text())
    modules = {row["module"] for row in summary["activations"]}
    # Attention's output is its projection's (one tensor, counted once, under the projection).
    assert {"blocks.0.attn.qkv", "blocks.0.attn.proj", "blocks.0.mlp.fc", "head"} <= modules
    flops = json.loads((lm_run["models"] / "bf16" / "summary.json").read_text())["flops"]
    assert flops["low_precision_share"] == 1.0 and flops["total"] > 0  # every matmul, attention too, in bf16


def test_a_block_longer_than_a_split_and_a_model_of_another_vocabulary_stop_before_any_work(tmp_path):
    from test_bad_inputs import _assert_clean_failure, _files

    raw = tmp_path / "raw"
    raw.mkdir()
    (raw / "t.txt").write_text(corpus(60))
    uri = f"sqlite:///{tmp_path / 'mlflow.db'}"
    factory = tmp_path / "lm_factories.py"
    factory.write_text("import torch\nfrom torch import nn\n"
                       "def small_vocab(vocab_size, block_size):\n"
                       "    return nn.Sequential(nn.Embedding(256, 8), nn.Linear(8, 100))\n")
    cases = [({"block_size": 512}, "train.block_size: 512 tokens (+1 for the last target) is longer than the val"),
             ({"model": "lm_factories:small_vocab", "model_code": str(factory), "width": None, "model_args": {}},
              "expected logits of shape (2, 16, 256)")]
    for train, expected in cases:
        params = tmp_path / "params.yaml"
        params.write_text(yaml.safe_dump(_lm_params(raw, **train)))
        data = tmp_path / "prepared"
        if not data.exists():
            assert _invoke_stage("prepare", ["--params", str(params), "--out", str(data)], uri).exit_code == 0
        before = _files(tmp_path)
        with pytest.MonkeyPatch.context() as mp:
            mp.syspath_prepend(str(tmp_path))
            result = _invoke_stage("train", ["--precision", "fp32", "--params", str(params), "--data", str(data),
                                             "--out", str(tmp_path / "m" / "fp32"), "--resume-dir",
                                             str(tmp_path / "r")], uri)
        _assert_clean_failure(result, expected, before, tmp_path, uri)


FORTUNES = Path("/usr/share/games/fortunes")


@pytest.mark.skipif(not FORTUNES.is_dir() and not os.environ.get("AMPBENCH_REQUIRE_FORTUNES"),
                    reason="Debian's fortunes is not installed (CI installs it)")
def test_debians_fortunes_folder_reads_as_text():
    """The real folder: its .dat indexes are skipped as binary, its .u8 links read once, all of it UTF-8."""
    tokens, read = read_tokens(FORTUNES)
    assert read["files"] >= 40 and read["binary_files_skipped"] >= 40
    assert 2_000_000 < len(tokens) < 4_000_000  # about 2.4 MB of English, not twice that (the links)


@pytest.mark.parametrize("factory", ["examples.my_lm:build", "examples.hf_gpt2:build"])
def test_your_language_model_trains_through_the_stages(tmp_path, factory, monkeypatch):
    """A factory build(vocab_size, block_size, ...) of your own, and a Hugging Face causal LM whose output has
    ``.logits`` (GPT2LMHeadModel from a config: no download), through the same path."""
    if "hf_" in factory and not os.environ.get("AMPBENCH_REQUIRE_TRANSFORMERS"):
        pytest.importorskip("transformers", reason="transformers is not installed (CI installs it)")
    from conftest import ROOT

    monkeypatch.syspath_prepend(str(ROOT))  # examples/ imports from the project root, as the stages do
    params = _lm_params(write_text_folder(tmp_path / "raw"), model=factory, width=None, model_args={},
                        model_code=f"examples/{factory.split('.')[1].split(':')[0]}.py", seeds=[0])
    out = _stages(tmp_path, params, ["fp32", "bf16"])
    assert out["comparison"]["bf16"]["verdict"] in ("equivalent", "inconclusive", "worse", "better")
    assert out["details"]["fp32"]["test_loss"] < math.log(256)  # learned: below a uniform guess over bytes
    assert out["history"][-1]["val_accuracy"] > 1 / 256


def test_a_task_of_your_own_changes_what_training_optimises(tmp_path, monkeypatch):
    """examples/my_task.py (label smoothing) through the stages: the same seed and data train to other weights
    than plain classification does, and the evaluation still judges accuracy."""
    from examples.my_task import task

    from conftest import ROOT
    from conftest import TINY as tiny

    monkeypatch.syspath_prepend(str(ROOT))
    logits, y = torch.randn(4, 10), torch.tensor([1, 2, 3, 4])
    assert torch.allclose(task().loss(logits, y), torch.nn.functional.cross_entropy(logits, y, label_smoothing=0.1))
    runs = {}
    for name, overrides in (("plain", {}), ("smoothed", {"task": "examples.my_task:task",
                                                          "task_code": "examples/my_task.py"})):
        params = yaml.safe_load(yaml.safe_dump(tiny))
        params["train"].update({"precisions": ["fp32", "bf16"], **overrides})
        params["mlflow"]["log_model"] = False
        (tmp_path / name).mkdir()
        runs[name] = _stages(tmp_path / name, params, ["fp32", "bf16"])
    assert runs["smoothed"]["history"][0]["train_loss"] != runs["plain"]["history"][0]["train_loss"]
    assert set(runs["smoothed"]["comparison"]["bf16"]) >= {"not_worse", "verdict", "delta_accuracy_pp"}
    assert runs["smoothed"]["details"]["fp32"]["test_accuracy"] > 0.2  # 10 classes: twice chance after an epoch


def test_a_task_missing_part_of_the_contract_is_one_line(tmp_path, monkeypatch):
    from ampbench.errors import ParamsError
    from ampbench.tasks.resolve import resolve_task

    (tmp_path / "half_task.py").write_text("class Half:\n    def loss(self, logits, y):\n        return 0\n"
                                           "def task():\n    return Half()\n")
    monkeypatch.syspath_prepend(str(tmp_path))
    with pytest.raises(ParamsError, match=r"train.task 'half_task:task' returned a Half without view, model_args, "
                                          r"output_error, logits, correct, validate, evaluate, paired"):
        resolve_task("half_task:task")


def test_fp16_overflowing_in_attention_is_found_and_fixed_by_keeping_attention_in_float32(tmp_path, monkeypatch):
    """examples/overflow_gpt.py: attention queries beyond 65504 in float16. The fp16 arm diverges, naming
    ``blocks.0.attn`` with the rerun that keeps it in float32; with ``train.fp32_modules: [blocks.*.attn]`` the
    same arm trains without a skipped step."""
    from conftest import ROOT

    monkeypatch.syspath_prepend(str(ROOT))
    raw = write_text_folder(tmp_path / "raw")
    base = {"model": "examples.overflow_gpt:build", "model_code": "examples/overflow_gpt.py", "width": None,
            "model_args": {"width": 16, "depth": 1, "heads": 2}, "precisions": ["fp32", "fp16"], "seeds": [0]}
    (tmp_path / "hot").mkdir()
    hot = _stages(tmp_path / "hot", _lm_params(raw, **base), ["fp32", "fp16"])
    assert hot["comparison"]["fp16"]["verdict"] == "diverged"
    summary = json.loads((tmp_path / "hot" / "models" / "fp16" / "summary.json").read_text())
    culprit = summary["first_nonfinite"]["0"]
    assert culprit["module"] == "blocks.0.attn" and culprit["phase"] == "forward"
    assert "train.fp32_modules=[\"blocks.0.attn\"]" in summary["seeds"]["0"]["fix"]
    (tmp_path / "fixed").mkdir()
    fixed = _stages(tmp_path / "fixed", _lm_params(raw, **base, fp32_modules=["blocks.*.attn"]), ["fp32", "fp16"])
    assert fixed["comparison"]["fp16"]["verdict"] != "diverged"
    assert fixed["details"]["fp16"]["skipped_steps"] <= 1  # the scaler's first calibration step at most


def test_an_interrupted_language_model_resumes_to_the_same_weights(tmp_path, monkeypatch):
    """Resume goes through the task too: a run cut in epoch 2 of 3 (after epoch 1's checkpoint) and resumed ends
    bitwise equal to one that was not cut."""
    from ampbench import tracking

    raw = write_text_folder(tmp_path / "raw")
    params = _lm_params(raw, precisions=["fp32"], seeds=[0], epochs=3)
    path = tmp_path / "params.yaml"
    path.write_text(yaml.safe_dump(params))
    uri = f"sqlite:///{tmp_path / 'mlflow.db'}"
    data = tmp_path / "prepared"
    assert _invoke_stage("prepare", ["--params", str(path), "--out", str(data)], uri).exit_code == 0

    def train(name: str):
        return _invoke_stage("train", ["--precision", "fp32", "--params", str(path), "--data", str(data), "--out",
                                       str(tmp_path / name / "fp32"), "--resume-dir", str(tmp_path / name / "r")], uri)

    assert train("whole").exit_code == 0
    real = tracking.log_epoch

    def cut_at_the_second(row, steps=()):  # epoch 2's metrics, before its checkpoint: as a SIGTERM there would
        if row["epoch"] == 2:
            raise KeyboardInterrupt("SIGTERM")
        real(row, steps)

    monkeypatch.setattr(tracking, "log_epoch", cut_at_the_second)
    assert train("cut").exit_code == 130
    monkeypatch.setattr(tracking, "log_epoch", real)
    again = train("cut")
    assert again.exit_code == 0 and "resuming after epoch 1 of 3" in again.output
    a = torch.load(tmp_path / "whole" / "fp32" / "seed0.pt", weights_only=True)["model"]
    b = torch.load(tmp_path / "cut" / "fp32" / "seed0.pt", weights_only=True)["model"]
    assert all(torch.equal(a[k], b[k]) for k in a)


def test_fix_keeps_a_language_models_planted_module_in_float32(tmp_path, monkeypatch):
    """examples/offset_model.py:build_lm, a bigram model whose embedding goes through the planted ``coords``: bf16
    loses the embedding in the origin and is worse by its loss per token, every value finite. `ampbench fix bf16`
    ranks the modules on the language model's logits, keeps ``coords`` in float32 and confirms it on a fresh seed,
    judged by the loss as the report judges a language model."""
    from ampbench.cli import main as ampbench
    from conftest import ROOT

    monkeypatch.syspath_prepend(str(ROOT))
    params = _lm_params(write_text_folder(tmp_path / "raw"), model="examples.offset_model:build_lm", width=None,
                        model_code="examples/offset_model.py", model_args={}, seeds=[0])
    params["speed"] = QUICK_SPEED
    out = _stages(tmp_path, params, ["fp32", "bf16"])
    assert out["comparison"]["bf16"]["not_worse"] == "worse", out["comparison"]["bf16"]
    assert not json.loads((tmp_path / "models" / "bf16" / "summary.json").read_text())["first_nonfinite"]
    (tmp_path / "data").mkdir()
    (tmp_path / "data" / "prepared").symlink_to(tmp_path / "prepared", target_is_directory=True)
    monkeypatch.setenv("MLFLOW_TRACKING_URI", f"sqlite:///{tmp_path / 'mlflow.db'}")
    result = CliRunner().invoke(ampbench, ["fix", "bf16", "--root", str(tmp_path)])
    assert result.exit_code == 0, result.output + repr(result.exception)
    lines = [line for line in result.output.splitlines() if not line.startswith("[")]
    assert lines[1].startswith('trial 1: ["coords"] kept in float32, seeds [0]: not worse (Δloss '), lines
    assert lines[2].startswith('confirmation: ["coords"] kept in float32, seeds [1]: not worse (Δloss '), lines
    assert """  .venv/bin/dvc exp run --temp -S 'train.fp32_modules=["coords"]'""" in lines, lines
