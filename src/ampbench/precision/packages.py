"""The packages beyond torch that some arms import (torchao, torch-optimi: ``config.arms.PACKAGES``), probed in one
place: installed, not installed (the arm is skipped, with the ``pip install`` line) or installed but broken (one
line naming the package and its error, never blamed on the user's code). Torch-free until a package is imported.
"""

from __future__ import annotations

from ampbench.config import arms
from ampbench.errors import AmpbenchError


def package_problem(name: str) -> str | None:
    """None when every package arm ``name`` imports (``arms.packages``) imports; why not when one is not installed
    (``resolve_policy`` skips the arm with it: ArmUnavailable); AmpbenchError when one is installed but importing it
    raises (a broken install: its error's first line, the package's to fix, not the user's code). The check stage
    and every stage that resolves the arm ask here."""
    import importlib
    import importlib.util

    for module, dist in arms.packages(arms.get(name)):
        top = module.partition(".")[0]
        if importlib.util.find_spec(top) is None:
            return f"{name} needs {dist}, which is not installed (pip install {dist})"
        from ampbench.precision.optimizers import torchao_quietly  # imports torch, as the package will

        try:
            with torchao_quietly():
                importlib.import_module(module)
        except ModuleNotFoundError as exc:
            if exc.name == top:
                return f"{name} needs {dist}, which is not installed (pip install {dist})"
            raise AmpbenchError(_broken(name, module, dist, exc)) from None  # a module it needs is missing
        except Exception as exc:  # noqa: BLE001  (an install can raise anything while importing)
            raise AmpbenchError(_broken(name, module, dist, exc)) from None
    return None


def _broken(name: str, module: str, dist: str, exc: Exception) -> str:
    text = str(exc).strip()
    first = f"{type(exc).__name__}: {text.splitlines()[0][:200]}" if text else type(exc).__name__
    return (f"{name} needs {dist}, whose install is broken: importing {module} raises {first} (a broken install of "
            f"{dist}, not your code); reinstall it (pip install --force-reinstall {dist}) or drop {name} from "
            "train.precisions")


def skipped_for_packages(precisions: list[str]) -> dict[str, str]:
    """The arms of ``precisions`` whose train stage will skip them for a package that is not installed, with why;
    AmpbenchError for a broken install (``package_problem``)."""
    return {arm: why for arm in precisions if arm in arms.ARMS and arms.packages(arms.get(arm))
            for why in [package_problem(arm)] if why}
