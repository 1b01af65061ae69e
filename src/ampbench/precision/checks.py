"""The check stage's checks beyond validating params.yaml (``config.validation``): what depends on this machine and
this installation. The rules that need the device (on the device ``train.device`` resolves to), the code files
params.yaml names (present, and tracked by git where a DVC experiment copies only tracked files), and the optional
packages of the arms asked for. ``ampbench decide`` runs the same checks before its first look.
"""

from __future__ import annotations

from pathlib import Path

from ampbench.config import rules
from ampbench.config.params import Params
from ampbench.config.user_code import CODE_KEYS, require_present
from ampbench.errors import ParamsError
from ampbench.precision.packages import skipped_for_packages


def check_run(params: Params, checkout: Path, project_root: Path) -> dict[str, str]:
    """Raise one line for what would stop a run (a device rule, a missing code file, a broken optional package);
    return the arms whose train stage will skip them for a package that is not installed, with why."""
    if rules.device_dependent(params):  # torch is imported only where a rule needs the device
        from ampbench.precision.policy import resolve_device

        for key, why in rules.on_device(params, resolve_device(params.train.device).type):
            raise ParamsError(f"{key}: {why}")
    sections = params.to_dict()
    paths = {key: sections[section][name] for key in CODE_KEYS for section, _, name in [key.partition(".")]}
    require_present(paths, checkout, project_root)
    return skipped_for_packages(params.train.precisions)
