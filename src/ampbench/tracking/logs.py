"""What goes into a run: params flattened, metrics in batches (one call per epoch, never per step), tags, files,
the data set and the model.
"""

from __future__ import annotations

import contextlib
import sys
import time
import warnings
from pathlib import Path
from typing import Any

from ampbench.tracking.retry import retry


def flatten(prefix: str, obj: Any) -> dict[str, str]:
    """Nested dicts → {"a.b": "value"} with string values, as MLflow params want them."""
    if isinstance(obj, dict):
        out: dict[str, str] = {}
        for key, value in obj.items():
            out.update(flatten(f"{prefix}.{key}" if prefix else str(key), value))
        return out
    return {prefix: str(obj)}


def log_batch(run_id: str, metrics: list = (), params: list = (), tags: list = ()) -> None:
    """``mlflow.entities`` Metrics, Params and RunTags onto run ``run_id`` in as few calls as MLflow takes (at most
    1000 metrics, 100 params and 100 tags per call)."""
    from mlflow.tracking import MlflowClient

    client = MlflowClient()
    for key, items, size in (("metrics", list(metrics), 1000), ("params", list(params), 100),
                             ("tags", list(tags), 100)):
        for start in range(0, len(items), size):
            retry(client.log_batch)(run_id, **{key: items[start:start + size]})


def log_to(run_id: str, metrics: dict[str, float], tags: dict[str, str], params: dict[str, str] | None = None,
           artifacts: list[Path] = (), artifact_dirs: dict[str, Path] | None = None) -> None:
    """Metrics, tags, params and files onto an existing (finished) run without reopening it."""
    from mlflow.entities import Metric, Param, RunTag
    from mlflow.tracking import MlflowClient

    client, now = MlflowClient(), int(time.time() * 1000)
    log_batch(run_id, metrics=[Metric(k, float(v), now, 0) for k, v in metrics.items()],
              params=[Param(k, v) for k, v in (params or {}).items()],
              tags=[RunTag(k, str(v)) for k, v in tags.items()])
    for path in artifacts:
        retry(client.log_artifact)(run_id, str(path))
    for folder_name, folder in (artifact_dirs or {}).items():
        retry(client.log_artifacts)(run_id, str(folder), artifact_path=folder_name)


def log_epoch(row: dict[str, float], steps: list[dict[str, float]] = ()) -> None:
    """One epoch's metrics, stepped by epoch so the UI's charts line runs up, plus the rows sampled every
    ``telemetry_every`` steps (under ``step/``, stepped by global step): one batched call per epoch."""
    import mlflow
    from mlflow.entities import Metric

    now = int(time.time() * 1000)
    epoch = int(row["epoch"])
    metrics = [Metric(k, float(v), now, epoch) for k, v in row.items() if k != "epoch"]
    for sample in steps:
        metrics += [Metric(f"step/{k}", float(v), now, int(sample["step"])) for k, v in sample.items() if k != "step"]
    log_batch(mlflow.active_run().info.run_id, metrics=metrics)


def log_metrics(metrics: dict[str, float]) -> None:
    import mlflow

    retry(mlflow.log_metrics)({k: float(v) for k, v in metrics.items()})


def log_dataset(name: str, digest: str, source_dir: Path) -> None:
    """Fill the runs table's Dataset column: name, digest (the prepared data's DVC hash) and where it is."""
    import mlflow
    from mlflow.data.dataset_source_registry import resolve_dataset_source
    from mlflow.data.meta_dataset import MetaDataset

    with warnings.catch_warnings():  # "can be interpreted in multiple ways": both readings are the local path
        warnings.simplefilter("ignore", UserWarning)
        source = resolve_dataset_source(str(Path(source_dir).resolve()))
    dataset = MetaDataset(source=source, name=name, digest=digest[:36])  # MLflow stores at most 36 characters
    retry(mlflow.log_input)(dataset, context="training")


def log_artifacts(paths: list[Path], artifact_path: str | None = None) -> None:
    import mlflow

    for p in paths:
        if Path(p).is_dir():
            retry(mlflow.log_artifacts)(str(p), artifact_path=artifact_path)
        else:
            retry(mlflow.log_artifact)(str(p), artifact_path=artifact_path)


def log_model(model, input_example, requirements: list[str]) -> str:
    """Log the model so ``mlflow.pytorch.load_model(uri)`` returns a working model; returns that URI.

    Explicit ``pip_requirements``: inferring them spawns a process and can fail offline. The input example has
    a batch of 2 so the exported graph keeps the batch dimension dynamic. MLflow's serving-input validation (load
    the model back as a pyfunc and predict the example: about 2.5 s per run, and a failure there is only a
    warning) is off; the tests load every logged model and predict with it instead.
    """
    with _no_requirement_scan():
        info = retry(mlflow_pytorch().log_model)(model, name="model", input_example=input_example,
                                                  pip_requirements=requirements, validate_serving_input=False)
    return info.model_uri


# mlflow.pytorch's module body imports its Lightning autologging only to export MLflow's checkpoint callback; with
# Lightning installed that brings in pytorch_lightning and torchmetrics: 2 s in every process that logs a model (a
# plain train stage 9.6 s -> 7.2 s without it, measured), for a part no stage uses.
_LIGHTNING_PART, _LIGHTNING_NAMES = "mlflow.pytorch._lightning_autolog", ("MlflowModelCheckpointCallback",)


def mlflow_pytorch():
    """``mlflow.pytorch`` without its Lightning part: the module it is on a machine without Lightning (its body
    catches the ImportError), except that the callback it exports still imports on first use, as
    ``mlflow.pytorch.autolog`` imports that part itself. As imported, where something imported it already."""
    import importlib

    if "mlflow.pytorch" in sys.modules or _LIGHTNING_PART in sys.modules:
        return importlib.import_module("mlflow.pytorch")
    sys.modules[_LIGHTNING_PART] = None  # type: ignore[assignment]  (importing it raises ImportError)
    try:
        module = importlib.import_module("mlflow.pytorch")
    finally:
        if sys.modules.get(_LIGHTNING_PART, 0) is None:
            del sys.modules[_LIGHTNING_PART]

    def __getattr__(name: str):
        if name in _LIGHTNING_NAMES:
            return getattr(importlib.import_module(_LIGHTNING_PART), name)
        raise AttributeError(f"module 'mlflow.pytorch' has no attribute {name!r}")

    module.__getattr__ = __getattr__
    return module


@contextlib.contextmanager
def _no_requirement_scan():
    """MLflow checks the given requirements against the installed packages by first mapping every installed
    distribution to its modules (about 2 s per process). Ours are this environment's own pinned versions
    (``run_requirements``), so the check cannot find a mismatch: it is skipped. Where MLflow has no such function
    any more, nothing is changed."""
    from mlflow.utils import environment

    name = "warn_dependency_requirement_mismatches"
    real = getattr(environment, name, None)
    if real is None:
        yield
        return
    setattr(environment, name, lambda *args, **kwargs: None)
    try:
        yield
    finally:
        setattr(environment, name, real)
