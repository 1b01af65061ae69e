"""DVC stage `speed`: every arm timed in one process, interleaved round by round, on the user's model, data, batch
size and input path; writes reports/interleaved.json, which evaluate reads for the report and speed.json.

Run: python pipeline/speed.py [--params params.yaml] [--data data/prepared] [--out reports/interleaved.json]
"""

from __future__ import annotations

from pathlib import Path

import click

from _common import data_option, debug_option, deterministic_cublas, layout, params_option, run, stage


@click.command()
@params_option
@data_option
@click.option("--out", "out_path", type=click.Path(dir_okay=False, path_type=Path), default=layout.INTERLEAVED,
              show_default=True, help="Where to write the per-round timings, ratios and memory.")
@debug_option
@stage
def main(params, data_dir: Path, out_path: Path) -> None:
    """Time every arm of train.precisions, A B C, C B A, …, and each arm's peak memory alone (CUDA)."""
    from ampbench.runtime.files import atomic_write_json
    from ampbench.stages import speed

    if params.train.deterministic:
        deterministic_cublas()
    result = speed.run(params, data_dir)
    out_path.parent.mkdir(parents=True, exist_ok=True)
    atomic_write_json(out_path, result)
    for line in speed.summary_lines(result):
        click.echo(line)


if __name__ == "__main__":
    run(main)
