"""DVC stage `check`: validate the whole params.yaml before any other stage, whatever DVC decides to rerun.

Run: python pipeline/check.py [--params params.yaml]

dvc.yaml makes every section of params.yaml a parameter of this stage, so any change to the file — a new key
included, such as the `train.epoch` that DVC's `-S +train.epoch=2` adds — reruns it, and a typo stops `dvc repro`
and `dvc exp run` with one line instead of recording an experiment in which nothing ran. Every rule between keys
(`config/rules.py`, e.g. speed.steps below twice speed.window) is checked here, a device-dependent one on the device
`train.device` resolves to, so no train stage runs first for a setting a later stage refuses. It also checks that
the code files dvc.yaml names exist in the copy DVC runs in (temporary and queued experiments copy only git-tracked
files), and says which arms their train stage will skip for an optional package that is not installed (torchao,
torch-optimi: skipping is what such an arm does) and stops on one whose install is broken. Its output holds no data:
prepare depends on it only so that DVC runs this stage first, and its content never changes, so passing the check
reruns nothing else.
"""

from __future__ import annotations

from pathlib import Path

import click

from _common import CHECKOUT, debug_option, layout, params_option, project_root, run, stage


@click.command()
@params_option
@click.option("--out", "out_path", type=click.Path(dir_okay=False, path_type=Path), default=layout.PARAMS_CHECK,
              show_default=True, help="File written when the params are valid (its content never changes).")
@debug_option
@stage
def main(params, out_path: Path) -> None:
    """Validate params.yaml (the stage wrapper already did) and the code paths it names; name the arms a missing
    optional package will skip."""
    from ampbench.precision.checks import check_run
    from ampbench.runtime.files import atomic_write_text

    for arm, why in check_run(params, CHECKOUT, project_root()).items():  # a broken install: one error line
        click.echo(f"train.precisions: {arm} will be skipped: {why}", err=True)
    out_path.parent.mkdir(parents=True, exist_ok=True)
    atomic_write_text(out_path, "params.yaml is valid; the prepare stage depends on this file only so that DVC runs "
                                "the check stage first.\n")
    click.echo("params.yaml: valid")


if __name__ == "__main__":
    run(main)
