"""The ``ampbench`` command: helpers around the pipeline (the stages themselves are in pipeline/).

Run: ampbench --help. Heavy imports (torch, mlflow) happen inside commands so --help is instant.
"""

from __future__ import annotations

import os
import sys
from pathlib import Path

import click


@click.group(context_settings={"help_option_names": ["-h", "--help"]})
def main() -> None:
    """ampbench: measure mixed precision (fp16, bf16, TF32) against strict fp32, with DVC and MLflow."""


@main.command()
@click.option("--root", type=click.Path(file_okay=False, path_type=Path), default=Path("."), show_default=True,
              help="Project root holding mlflow.db and mlartifacts/ (the pipeline's default store).")
@click.option("--experiment", default=None, help="Experiment to link to  [default: mlflow.experiment in params.yaml]")
@click.option("--port", type=int, default=5000, show_default=True, help="Port for the UI on 127.0.0.1.")
@click.option("--host", default="127.0.0.1", show_default=True,
              help="Interface to bind. Keep loopback; for remote access use an SSH tunnel, not 0.0.0.0.")
@click.option("--dry-run", is_flag=True, help="Print the command and link, do not start the server.")
def ui(root: Path, experiment: str | None, port: int, host: str, dry_run: bool) -> None:
    """Start the MLflow UI on the pipeline's store and print the link to its training-runs table."""
    from ampbench import tracking
    from ampbench.params import load_params

    root = root.resolve()
    name = experiment or load_params(root / "params.yaml").mlflow.experiment
    uri, _ = tracking.store_uris(root)
    exp_id = tracking.setup(root, name)
    cmd = [sys.executable, "-m", "mlflow", "server", "--backend-store-uri", uri, "--host", host, "--port", str(port)]
    # The UI opens experiments in its GenAI view by default; this query opens the runs table instead.
    click.echo(f"MLflow UI: http://{host}:{port}/#/experiments/{exp_id}/runs?workflowType=machine_learning")
    click.echo(" ".join(cmd))
    if not dry_run:
        os.execv(sys.executable, cmd)


@main.command(context_settings={"ignore_unknown_options": True, "help_option_names": []}, add_help_option=False)
@click.argument("args", nargs=-1, type=click.UNPROCESSED)
def bench(args: tuple[str, ...]) -> None:
    """Pipeline loop vs the tutorial's bare loop, and every arm vs fp32/tf32 (run `ampbench bench --help`)."""
    from ampbench.bench import main as bench_main

    raise SystemExit(bench_main(list(args)))


@main.command()
@click.argument("revisions", nargs=-1, required=True)
@click.option("--repo", default=".", show_default=True, help="DVC project to read the revisions from.")
@click.option("--json", "json_out", type=click.Path(dir_okay=False, path_type=Path), default=None,
              help="Also write the comparison as JSON to this file.")
def compare(revisions: tuple[str, ...], repo: str, json_out: Path | None) -> None:
    """Lay the verdicts of DVC experiments or git revisions side by side.

    REVISIONS: experiment names (see `dvc exp show`), branches, tags, commits, or `workspace`.
    """
    import json

    from ampbench.errors import AmpbenchError
    from ampbench.experiments import compare_revisions, markdown

    try:
        result = compare_revisions(list(revisions), repo)
    except AmpbenchError as exc:
        raise click.ClickException(str(exc)) from None
    click.echo(markdown(result))
    if json_out:
        json_out.write_text(json.dumps(result, indent=2, default=str) + "\n")


@main.command("sync-params")
@click.option("--root", type=click.Path(file_okay=False, path_type=Path), default=Path("."), show_default=True,
              help="Project root holding params.yaml and dvc.yaml.")
@click.option("--check", is_flag=True, help="Change nothing; exit 1 if either file is out of date.")
def sync_params(root: Path, check: bool) -> None:
    """Rewrite params.yaml (values kept; keys, order and comments from the schema in src/ampbench/params.py) and
    the `params:` list of every stage in dvc.yaml (the keys each stage reads)."""
    from ampbench.errors import AmpbenchError
    from ampbench.params_sync import sync

    try:
        changed = sync(root, write=not check)
    except AmpbenchError as exc:
        raise click.ClickException(str(exc)) from None
    for path in changed:
        click.echo(f"{'out of date' if check else 'rewrote'}: {path}")
    if check and changed:
        raise SystemExit(1)


if __name__ == "__main__":
    main()
