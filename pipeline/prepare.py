"""DVC stage `prepare`: load the configured data set, split and normalise it, write data/prepared/.

Run: python pipeline/prepare.py [--params params.yaml] [--raw DIR] [--out data/prepared]
"""

from __future__ import annotations

from pathlib import Path

import click

from _common import CHECKOUT, debug_option, folder_option, layout, params_option, run, stage


@click.command()
@params_option
@click.option("--raw", "raw_dir", type=click.Path(file_okay=False, path_type=Path), default=None,
              help="Folder with the raw data; overrides prepare.raw_dir (default: prepare.raw_dir).")
@folder_option("--out", "out_dir", str(layout.PREPARED), "Folder to write the prepared tensors and meta.json into.")
@debug_option
@stage
def main(params, raw_dir: Path, out_dir: Path) -> None:
    """Prepare the data set named by prepare.dataset."""
    from ampbench.config.user_code import require_tracked
    from ampbench.data.prepare import cut_notes, describe, prepare, save_prepared

    require_tracked("prepare.dataset", params.prepare.dataset, params.prepare.dataset_code, CHECKOUT)
    data = prepare(params.prepare, raw_dir or Path(params.prepare.raw_dir))
    save_prepared(data, out_dir)
    click.echo(f"prepared {describe(data.meta)} → {out_dir}")
    for note in cut_notes(data.meta):  # what the caps cut, and a validation split far larger than training
        click.echo(note)


if __name__ == "__main__":
    run(main)
