"""The ``ampbench`` command: helpers around the pipeline (the stages themselves are in pipeline/).

Run: ampbench --help. Heavy imports (torch, mlflow) happen inside commands so --help is instant.
"""

from __future__ import annotations

import functools
import os
import sys
from pathlib import Path

import click

from ampbench.errors import interrupted_line


@click.group(context_settings={"help_option_names": ["-h", "--help"]})
def main() -> None:
    """ampbench: measure mixed precision (fp16, bf16, TF32) against strict fp32, with DVC and MLflow."""


def one_line(exc: Exception) -> str:
    """The ``error: …`` line that ends a command: the message (for an OSError the file and the reason), with the
    tracking URI's password masked."""
    from ampbench.tracking import mask

    if isinstance(exc, OSError):
        text = (f"{exc.filename}: " if exc.filename else "") + str(exc.strerror or exc)
    else:
        text = str(exc)
    return f"error: {mask(text)}"


def one_line_errors(fn):
    """Errors a user can cause end a command with one line (``error: …``, password masked) and exit 2."""

    @functools.wraps(fn)
    def wrapper(*args, **kwargs):
        from ampbench.errors import AmpbenchError

        try:
            return fn(*args, **kwargs)
        except (AmpbenchError, OSError) as exc:
            click.echo(one_line(exc), err=True)
            raise SystemExit(2) from None

    return wrapper


def interrupted_exits_130(fn):
    """Ctrl-C or SIGTERM ends a long command with one line saying what is kept (an ``Interrupted`` knows) and 130,
    also where C code wrapped the signal's KeyboardInterrupt in its own error (below ``one_line_errors``, so that
    such an error is not said as one)."""

    @functools.wraps(fn)
    def wrapper(*args, **kwargs):
        from ampbench.runtime import signals

        try:
            with signals.interruptions_unwrapped():
                return fn(*args, **kwargs)
        except KeyboardInterrupt as exc:
            click.echo(interrupted_line(exc), err=True)
            raise SystemExit(130) from None

    return wrapper


@main.command()
@click.option("--root", type=click.Path(file_okay=False, path_type=Path), default=Path("."), show_default=True,
              help="Project root holding mlflow.db and mlartifacts/ (the pipeline's default store).")
@click.option("--experiment", default=None, help="Experiment to link to  [default: mlflow.experiment in params.yaml]")
@click.option("--port", type=click.IntRange(0, 65535), default=5000, show_default=True,
              help="Port for the UI on 127.0.0.1; 0 picks a free one.")
@click.option("--host", default="127.0.0.1", show_default=True,
              help="Interface to bind. Keep loopback; for remote access use an SSH tunnel, not 0.0.0.0.")
@click.option("--wait", type=click.FloatRange(1, 600), default=120, show_default=True,
              help="Seconds to wait for the server to answer before giving up.")
@click.option("--workers", type=click.IntRange(1, 64), default=1, show_default=True,
              help="Server worker processes (about 200 MB each); one serves a user on this machine.")
@click.option("--log", "log_path", type=click.Path(dir_okay=False, path_type=Path), default=None,
              help="File the server's own output goes to  [default: mlflow-ui.log under --root]")
@click.option("--dry-run", is_flag=True, help="Print the command and link, do not start the server.")
@one_line_errors
def ui(root: Path, experiment: str | None, port: int, host: str, wait: float, workers: int, log_path: Path | None,
       dry_run: bool) -> None:
    """Start the MLflow UI on the pipeline's store; print the link to its training-runs table once it answers.

    The server's output (a screenful of start-up lines) goes to a log file, so the link is what you see.

    The store URI reaches the server through its environment (MLFLOW_BACKEND_STORE_URI), never its command line,
    which every user of the machine can read with `ps`. MLflow's job runner (GenAI jobs: a pool of worker
    processes the runs table never uses) stays off unless MLFLOW_SERVER_ENABLE_JOB_EXECUTION says otherwise.
    """
    from ampbench import tracking
    from ampbench.config.validation import load_params
    from ampbench.runtime import server

    root = root.resolve()
    name = experiment or load_params(root / "params.yaml").mlflow.experiment
    if not dry_run:
        port = server.free_port(host, port)
    uri, _ = tracking.store_uris(root)
    exp_id = tracking.setup(root, name)
    cmd = [sys.executable, "-m", "mlflow", "server", "--host", host, "--port", str(port), "--workers", str(workers)]
    # The UI opens experiments in its GenAI view by default; this query opens the runs table instead.
    link = f"http://{host}:{port}/#/experiments/{exp_id}/runs?workflowType=machine_learning"
    if dry_run:
        click.echo(f"MLFLOW_BACKEND_STORE_URI={tracking.redact(uri)} {' '.join(cmd)}")
        click.echo(f"MLflow UI: {link}")
        return
    env = {"MLFLOW_SERVER_ENABLE_JOB_EXECUTION": "false", **os.environ, "MLFLOW_BACKEND_STORE_URI": uri}
    server.serve(cmd, env, (host, port), wait, log_path or root / "mlflow-ui.log",
                 lambda log: click.echo(f"MLflow UI: {link}  (Ctrl-C stops it; the server's log: {log})"))


@main.command(context_settings={"ignore_unknown_options": True, "help_option_names": []}, add_help_option=False)
@click.argument("args", nargs=-1, type=click.UNPROCESSED)
def bench(args: tuple[str, ...]) -> None:
    """Pipeline loop vs the tutorial's bare loop, and every arm vs fp32/tf32 (run `ampbench bench --help`)."""
    from ampbench.bench.cli import main as bench_main

    raise SystemExit(bench_main(list(args)))


@main.command()
@click.argument("revisions", nargs=-1, required=True)
@click.option("--repo", default=".", show_default=True, help="DVC project to read the revisions from.")
@click.option("--json", "json_out", type=click.Path(dir_okay=False, path_type=Path), default=None,
              help="Also write the comparison as JSON to this file.")
@one_line_errors
def compare(revisions: tuple[str, ...], repo: str, json_out: Path | None) -> None:
    """Lay the verdicts of DVC experiments or git revisions side by side.

    REVISIONS: experiment names (see `dvc exp show`), branches, tags, commits, or `workspace`.
    """
    import json

    from ampbench.report.experiments import compare_revisions, markdown

    result = compare_revisions(list(revisions), repo)
    click.echo(markdown(result))
    if json_out:
        json_out.write_text(json.dumps(result, indent=2, default=str) + "\n")


@main.command()
@click.option("--root", type=click.Path(file_okay=False, path_type=Path), default=Path("."), show_default=True,
              help="Project root (a git + DVC repo holding params.yaml and dvc.yaml).")
@click.option("--min-seeds", type=click.IntRange(2, 1000), default=3, show_default=True,
              help="Seeds at the first look (docs/verdict-simulation.md: 2 stops there seldom and saves nothing).")
@click.option("--max-seeds", type=click.IntRange(2, 1000), default=8, show_default=True,
              help="Seeds at the last look: the procedure stops there at the latest.")
@click.option("--spending", type=click.Choice(["pocock", "obrien_fleming"]), default="pocock", show_default=True,
              help="Alpha-spending function: pocock stops earlier, obrien_fleming keeps the last look nearly as "
                   "strict as a fixed design's (docs/verdict.md#seeds-until-decided).")
@click.option("--until", type=click.Choice(["not_worse", "equivalent"]), default="not_worse", show_default=True,
              help="Stop once every arm's not-worse verdict is decided, or its equivalence verdict too.")
@click.option("--first-seed", type=click.IntRange(0), default=0, show_default=True,
              help="The looks train seeds first-seed, first-seed + 1, …")
@click.option("-S", "--set", "extra", multiple=True, metavar="KEY=VALUE",
              help="A params setting for every look, as `dvc exp run -S` takes it (repeatable).")
@one_line_errors
@interrupted_exits_130
def decide(root: Path, min_seeds: int, max_seeds: int, spending: str, until: str, first_seed: int,
           extra: tuple[str, ...]) -> None:
    """Train seed by seed until every arm's verdict is decided: one `dvc exp run` per look, from --min-seeds to
    --max-seeds, with verdicts valid over the repeated looks (alpha spending). Rerunning it trains nothing new."""
    from ampbench.stages.decide import decide as run_looks
    from ampbench.verdict.sequential import Design

    if min_seeds > max_seeds:
        raise click.BadParameter(f"{min_seeds} is more than --max-seeds {max_seeds}", param_hint="--min-seeds")
    design = Design(min_seeds, max_seeds, spending, until=until)
    result = run_looks(root.resolve(), design, first_seed, extra, say=click.echo)
    click.echo(f"stopped at look {result.look} with seeds {result.seeds}: reports/report.md; each look in "
               "`dvc exp show`, and in MLflow under the tag sequential.group")


@main.command()
@click.argument("arm")
@click.option("--root", type=click.Path(file_okay=False, path_type=Path), default=Path("."), show_default=True,
              help="Project root: params.yaml, the prepared data and models/ as `dvc repro` left them.")
@click.option("--seed", type=int, default=None, help="The fp32 seed ranked  [default: the first of train.seeds]")
@click.option("--examples", type=click.IntRange(1), default=256, show_default=True, help="Validation examples used.")
@click.option("--top", type=click.IntRange(1), default=10, show_default=True, help="Modules to list.")
@one_line_errors
def sensitivity(arm: str, root: Path, seed: int | None, examples: int, top: int) -> None:
    """Rank the modules to keep in float32 for ARM (autocast, *_pure, float8); on the fp32 model, no training."""
    from ampbench.stages.sensitivity import rank_in_project, ranking_lines

    click.echo("\n".join(ranking_lines(rank_in_project(arm, root.resolve(), seed, examples), top)))


@main.command()
@click.argument("arm")
@click.option("--root", type=click.Path(file_okay=False, path_type=Path), default=Path("."), show_default=True,
              help="Project root: params.yaml, the prepared data, models/ and reports/ as `dvc repro` left them.")
@click.option("--budget", type=int, default=None,
              help="Trainings of ARM the search may spend, its confirmation's included  [default: 3 × log2(the "
                   "candidates + 1) × train.seeds, plus as many fresh seeds]")
@click.option("--until", type=click.Choice(["not_worse", "equivalent"]), default="not_worse", show_default=True,
              help="The verdict a trial must reach: not worse than fp32, or equivalent (inside the margin on both "
                   "sides, as report.md's equivalence verdict).")
@one_line_errors
@interrupted_exits_130
def fix(arm: str, root: Path, budget: int | None, until: str) -> None:
    """Find the modules to keep in float32 so that ARM (autocast, *_pure, float8) is shown not worse than fp32 (or
    equivalent): a search over the modules' ranking with trainings judged by the pipeline's verdicts, each looked
    at after every seed as `ampbench decide` does, its answer confirmed on fresh seeds
    (docs/which-part-needs-float32.md). params.yaml and the pipeline's outputs stay as they are; the record goes to
    reports/fix/, which the next `dvc repro` puts into report.md, and each trial into `dvc exp show` (fix-ARM-N)."""
    from ampbench.stages.fix import fix_in_project

    fix_in_project(arm, root, budget, say=click.echo, until=until)


@main.group()
def cluster() -> None:
    """The pipeline with its training cells on a Ray cluster (docs/cluster.md; make install-cluster)."""


@cluster.command("repro")
@click.option("--address", required=True, help="The Ray head's host:port, as `ray start --head` printed it.")
@click.option("--root", type=click.Path(file_okay=False, path_type=Path), default=Path("."), show_default=True,
              help="Project root (a git + DVC repo with a default DVC remote every node can reach).")
@click.option("--cpus", type=click.FloatRange(0, min_open=True), default=1.0, show_default=True,
              help="CPUs per cell: a node with N CPUs runs N / --cpus cells at once.")
@click.option("--gpus", type=click.FloatRange(0), default=None,
              help="GPUs per cell  [default: 1 when this machine has CUDA, else 0]")
@click.option("--accelerator-type", default=None,
              help="Only nodes of this Ray accelerator type (e.g. H100): one comparison, one device kind.")
@click.option("--resource", default=None,
              help="Only nodes that declare this custom resource (ray start --resources '{\"NAME\": 1}').")
@click.option("--retries", type=click.IntRange(0, 20), default=3, show_default=True,
              help="Times a cell runs again after its worker or node was lost.")
@one_line_errors
@interrupted_exits_130
def cluster_repro(address: str, root: Path, cpus: float, gpus: float | None, accelerator_type: str | None,
                  resource: str | None, retries: int) -> None:
    """Run the pipeline with every stale arm × seed cell as a task on the Ray cluster at --address, then record
    them with `dvc repro` here (the train stages collect the cells; speed and evaluate run on this node)."""
    from ampbench.cluster.grid import Placement
    from ampbench.cluster.repro import Options
    from ampbench.cluster.repro import cluster_repro as run_grid

    if gpus is None:
        import torch

        gpus = 1.0 if torch.cuda.is_available() else 0.0
    run_grid(root, Options(address, Placement(cpus, gpus, accelerator_type, resource), retries))


@main.command("sync-params")
@click.option("--root", type=click.Path(file_okay=False, path_type=Path), default=Path("."), show_default=True,
              help="Project root holding params.yaml and dvc.yaml.")
@click.option("--check", is_flag=True, help="Change nothing; exit 1 if either file is out of date.")
@one_line_errors
def sync_params(root: Path, check: bool) -> None:
    """Rewrite params.yaml (values kept; keys, order and comments from the schema in src/ampbench/config/params.py) and
    the `params:` list of every stage in dvc.yaml (the keys each stage reads)."""
    from ampbench.config.sync import sync

    changed = sync(root, write=not check)
    for path in changed:
        click.echo(f"{'out of date' if check else 'rewrote'}: {path}")
    if check and changed:
        raise SystemExit(1)


def entry() -> None:
    """The ``ampbench`` command (pyproject's script): ``main``, and an interrupted command's 130 for sure
    (``signals.entry_point``)."""
    from ampbench.runtime import signals

    signals.entry_point(main)


if __name__ == "__main__":
    entry()
