"""The one package that talks to MLflow: the store (``uris``, ``store``, ``retry``), the runs (``runs``), what is
logged into them (``logs``) and where MLflow's own log records go (``own_log``: logs/mlflow.log, not the terminal).
The rest of the library calls it as ``tracking.<name>``.

A parent run per pipeline execution holds the runs per arm and seed nested under it and, after evaluate, the
comparison. Metrics are sent in one batch per epoch, never per step.
"""

from ampbench.tracking.logs import (
    flatten,
    log_artifacts,
    log_batch,
    log_dataset,
    log_epoch,
    log_metrics,
    log_model,
    log_to,
)
from ampbench.tracking.runs import (
    close_lost_attempts,
    end_execution,
    evaluation_parent,
    execution_name,
    execution_parent,
    open_run,
    parent_of,
    run_exists,
    scratch_run,
    search_parent,
)
from ampbench.tracking.store import close_dead_runs, setup
from ampbench.tracking.uris import ARTIFACTS_DIR, DB_NAME, check_uri, mask, redact, store_uris

__all__ = ["ARTIFACTS_DIR", "DB_NAME", "check_uri", "close_dead_runs", "close_lost_attempts", "end_execution",
           "evaluation_parent", "execution_name", "execution_parent", "flatten", "log_artifacts", "log_batch",
           "log_dataset", "log_epoch", "log_metrics", "log_model", "log_to", "mask", "open_run", "parent_of",
           "redact", "run_exists", "scratch_run", "search_parent", "setup", "store_uris"]
