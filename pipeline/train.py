"""DVC stage `train@<precision>`: train one precision arm for every seed in train.seeds.

Run: python pipeline/train.py --precision fp16 [--params params.yaml]
Writes models/<precision>/ (checkpoints, history, summary) and one MLflow run per seed.
"""

from __future__ import annotations

from pathlib import Path

import click

from _common import (
    CHECKOUT,
    code_version,
    data_option,
    debug_option,
    deterministic_cublas,
    folder_option,
    layout,
    params_option,
    project_root,
    relaunch_under_torchrun,
    run,
    run_tags,
    stage,
)
from ampbench.config.arms import ABLATIONS, MAIN, OPT_IN


@click.command()
@click.option("--precision", required=True,
              help=f"Precision arm to train: {', '.join(MAIN)}, an opt-in arm ({', '.join(OPT_IN)}) "
                   f"or an ablation ({', '.join(ABLATIONS)}).")
@params_option
@data_option
@folder_option("--out", "out_dir", None, "Output folder for this arm  [default: models/<precision>]")
@folder_option("--resume-dir", "resume_dir", None,
               "Where per-epoch checkpoints of an unfinished arm wait to be resumed  [default: .resume/<precision>; "
               "kept outside models/ because DVC empties outputs before a stage runs]")
@click.option("--seed", "cell_seeds", type=int, multiple=True,
              help="A cluster cell (`ampbench cluster repro`): train only this seed of train.seeds (repeatable) and "
                   "leave it finished in --resume-dir for the stage run that collects it; nothing under --out.")
@click.option("--parent-run", default=None, help="With --seed: the cluster execution's MLflow parent run.")
@click.option("--node", default=None, help="With --seed: the Ray node id recorded with each seed.")
@debug_option
@stage
def main(params, precision: str, data_dir: Path, out_dir: Path | None, resume_dir: Path | None,
         cell_seeds: tuple[int, ...], parent_run: str | None, node: str | None) -> None:
    """Train the model under one precision arm, once per seed, logging each run to MLflow.

    Interrupted? Run it again: it resumes from the last completed epoch.
    """
    from ampbench.runtime.distributed import launched_by_torchrun
    from ampbench.stages.preflight import check_request
    from ampbench.stages.train import train_arm

    cell = check_request(precision, params, CHECKOUT, cell_seeds, parent_run, node)
    if params.train.nproc_per_node > 1 and not launched_by_torchrun():
        relaunch_under_torchrun(params.train.nproc_per_node)  # does not return
    if params.train.deterministic:
        deterministic_cublas()
    code = code_version(params.train.model_code, params.train.task_code)
    train_arm(precision, params, data_dir, out_dir or layout.MODELS / precision, project_root(), run_tags(),
              resume_dir=resume_dir or layout.RESUME / precision, code_version=code, cell=cell)


if __name__ == "__main__":
    run(main)
