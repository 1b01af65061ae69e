"""Every params key a stage reads is declared in that stage's `params:` list in dvc.yaml, so changing it reruns
the stage. Measured, not assumed: each stage runs on tiny params that record every key read through them."""

from __future__ import annotations

import dataclasses
import sys

import pytest
import yaml
from click.testing import CliRunner

from ampbench.config.params import Params
from ampbench.config.validation import load_params
from conftest import ROOT
from test_cli import _stage

# Keys a stage reads that are not dependencies of its outputs (so they are deliberately not declared):
READ_NOT_DEPENDED_ON = {
    # The train stage only checks that --precision is one of them; dvc.yaml's matrix makes one stage per entry,
    # so adding an arm must not retrain the others.
    "train.precisions": "train",
    # Draws the progress bar.
    "train.progress": "train",
    # Whether the finished seeds' resume checkpoints outlive the arm (for a later run with more seeds): what is
    # left in .resume/, not what the outputs hold.
    "train.keep_finished": "train",
    # Choose how batches reach the device; both paths give the same batches, bit for bit (test_loader), so the
    # weights do not depend on them.
    "train.data_on_device": "train",
    "train.loader_workers": "train",
    # How often MLflow samples CPU/GPU load into system/* metrics: observation, not results.
    "mlflow.system_metrics_every": "train",
}


class Recorder:
    """Stands in for a params section and records the dotted key of every value read through it. Values read by
    the sections' own methods (``to_dict``: MLflow params, resume keys) are provenance and are not counted."""

    def __init__(self, section, prefix: str, reads: set[str]):
        self._section, self._prefix, self._reads = section, prefix, reads

    def __getattr__(self, name: str):
        value = getattr(self._section, name)
        if name not in {f.name for f in dataclasses.fields(self._section)}:
            return value
        key = self._prefix + name
        if dataclasses.is_dataclass(value):
            return Recorder(value, key + ".", self._reads)
        self._reads.add(key)
        return value


def undeclared(reads: set[str], declared: list[str], stage: str) -> list[str]:
    """The keys in ``reads`` that no entry of ``declared`` covers (an entry covers itself and its sub-keys)."""
    def covered(key: str) -> bool:
        return any(key == d or key.startswith(d + ".") for d in declared) or READ_NOT_DEPENDED_ON.get(key) == stage

    return sorted(k for k in reads if not covered(k))


def test_the_check_catches_an_undeclared_read():
    # The evaluate stage once read train.model for its report without declaring it.
    assert undeclared({"train.model", "evaluate.confidence"}, ["evaluate"], "evaluate") == ["train.model"]
    reads: set[str] = set()
    p = Recorder(Params(), "", reads)
    assert p.train.grad_scaler.init_scale == 65536.0 and p.train.to_dict()["lr"] == 0.003
    assert reads == {"train.grad_scaler.init_scale"}


@pytest.fixture(scope="module")
def stage_reads(tmp_path_factory) -> dict[str, set[str]]:
    """Run prepare → train (fp32, fp16) → speed → evaluate in-process on tiny params; the keys each stage read."""
    import _common
    from conftest import TINY, torch_flags_restored

    tmp = tmp_path_factory.mktemp("reads")
    params = yaml.safe_load(yaml.safe_dump(TINY))
    params["train"]["precisions"] = ["fp32", "fp16"]
    params["mlflow"]["log_model"] = False
    path = tmp / "params.yaml"
    path.write_text(yaml.safe_dump(params))
    data, models, reports = tmp / "prepared", tmp / "models", tmp / "reports"
    runs = {"prepare": [["--out", str(data)]],
            "train": [["--precision", arm, "--data", str(data), "--out", str(models / arm), "--resume-dir",
                       str(tmp / ".resume" / arm)] for arm in ("fp32", "fp16")],
            "speed": [["--data", str(data), "--out", str(reports / "interleaved.json")]],
            "evaluate": [["--data", str(data), "--models", str(models), "--reports", str(reports)]]}
    reads: dict[str, set[str]] = {}
    # Training in this process sets torch's global flags (deterministic kernels): put them back for later files.
    with pytest.MonkeyPatch.context() as mp, torch_flags_restored():
        mp.setenv("MLFLOW_TRACKING_URI", f"sqlite:///{tmp / 'mlflow.db'}")
        for stage, arg_lists in runs.items():
            reads[stage] = set()
            mp.setattr(sys.modules["_common"], "load_params",
                       lambda p, seen=reads[stage]: Recorder(load_params(p), "", seen))
            for args in arg_lists:
                result = CliRunner().invoke(_stage(stage), ["--params", str(path), *args])
                assert result.exit_code == 0, result.output + str(result.exception)
    assert _common.load_params is load_params  # the patch is gone
    return reads


@pytest.mark.parametrize("stage", ["prepare", "train", "speed", "evaluate"])
def test_stages_read_only_declared_params(stage_reads, stage):
    declared = yaml.safe_load((ROOT / "dvc.yaml").read_text())["stages"][stage]["params"]
    reads = stage_reads[stage]
    assert reads, "recorded nothing: the recorder is not in the stage's path"
    assert undeclared(reads, declared, stage) == [], f"{stage} reads keys dvc.yaml does not list for it"


def test_the_recorder_saw_the_reads_that_matter(stage_reads):
    """The loop really reads its settings through the params (not copies made elsewhere)."""
    assert {"train.lr", "train.loss_multiplier", "train.telemetry_every", "train.grad_scaler.init_scale",
            "train.divergence.max_consecutive_skips"} <= stage_reads["train"]
    assert {"prepare.dataset", "prepare.seed"} <= stage_reads["prepare"]
    assert {"evaluate.confidence", "evaluate.margin.accuracy_pp", "train.seeds"} <= stage_reads["evaluate"]
    assert {"speed.rounds", "train.batch_size", "train.lr", "train.data_on_device"} <= stage_reads["speed"]
