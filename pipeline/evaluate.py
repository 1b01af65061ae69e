"""DVC stage `evaluate`: every arm against the fp32 baseline of the same seed, on the test split.

Run: python pipeline/evaluate.py [--params params.yaml]
Writes reports/comparison.json and speed.json (DVC metrics: per arm the verdict, Δaccuracy with CI, speed and
memory × fp32), reports/curves.json (DVC plots), report.md, details.json and figures/; adds test metrics and the
verdict to each arm × seed MLflow run and the comparison to the execution's parent run.
"""

from __future__ import annotations

from pathlib import Path

import click

from _common import (
    data_option,
    debug_option,
    deterministic_cublas,
    folder_option,
    layout,
    params_option,
    project_root,
    run,
    run_tags,
    stage,
)


@click.command()
@params_option
@data_option
@folder_option("--models", "models_dir", str(layout.MODELS), "Folder holding one sub-folder per trained arm.")
@folder_option("--reports", "reports_dir", str(layout.REPORTS), "Folder to write metrics, plots and the report into.")
@click.option("--speed", "speed_path", type=click.Path(dir_okay=False, path_type=Path), default=None,
              help="The speed stage's interleaved timings  [default: interleaved.json in --reports; without it the "
                   "report's speed comes from training time]")
@debug_option
@stage
def main(params, data_dir: Path, models_dir: Path, reports_dir: Path, speed_path: Path | None) -> None:
    """Compare every precision arm with the fp32 baseline and write the reports."""
    from ampbench.stages.evaluate import evaluate_arms

    deterministic_cublas()  # the comparison must reproduce exactly, whatever train.deterministic says
    evaluate_arms(params, data_dir, models_dir, reports_dir, project_root(), run_tags(), speed_path)
    click.echo(layout.ReportFiles(reports_dir).report.read_text())


if __name__ == "__main__":
    run(main)
