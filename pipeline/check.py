"""DVC stage `check`: validate the whole params.yaml before any other stage, whatever DVC decides to rerun.

Run: python pipeline/check.py [--params params.yaml]

dvc.yaml makes every section of params.yaml a parameter of this stage, so any change to the file — a new key
included, such as the `train.epoch` that DVC's `-S +train.epoch=2` adds — reruns it, and a typo stops `dvc repro`
and `dvc exp run` with one line instead of recording an experiment in which nothing ran. Every rule between keys
(`config/rules.py`, e.g. speed.steps below twice speed.window) is checked here, a device-dependent one on the device
`train.device` resolves to, so no train stage runs first for a setting a later stage refuses. It also checks that
the code files dvc.yaml names exist in the copy DVC runs in (temporary and queued experiments copy only git-tracked
files). Its output holds no data: prepare depends on it only so that DVC runs this stage first, and its content
never changes, so passing the check reruns nothing else.
"""

from __future__ import annotations

from pathlib import Path

import click

from _common import CHECKOUT, debug_option, layout, params_option, project_root, stage


@click.command()
@params_option
@click.option("--out", "out_path", type=click.Path(dir_okay=False, path_type=Path), default=layout.PARAMS_CHECK,
              show_default=True, help="File written when the params are valid (its content never changes).")
@debug_option
@stage
def main(params, out_path: Path) -> None:
    """Validate params.yaml (the stage wrapper already did) and the code paths it names."""
    from ampbench.config import rules
    from ampbench.config.user_code import CODE_KEYS, require_present
    from ampbench.errors import ParamsError
    from ampbench.runtime.files import atomic_write_text

    if rules.device_dependent(params):  # the table's other rules ran when the stage wrapper loaded the params
        from ampbench.precision.policy import resolve_device

        for key, why in rules.on_device(params, resolve_device(params.train.device).type):
            raise ParamsError(f"{key}: {why}")
    sections = params.to_dict()
    paths = {key: sections[section][name] for key in CODE_KEYS for section, _, name in [key.partition(".")]}
    require_present(paths, CHECKOUT, project_root())
    out_path.parent.mkdir(parents=True, exist_ok=True)
    atomic_write_text(out_path, "params.yaml is valid; the prepare stage depends on this file only so that DVC runs "
                                "the check stage first.\n")
    click.echo("params.yaml: valid")


if __name__ == "__main__":
    main()
