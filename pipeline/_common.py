"""Shared edge of the stage commands: which library and project root to use, params, one-line errors.

Stage scripts import this first. It puts this checkout's ``src/`` on the path so a queued experiment (which
DVC runs in a temporary copy) runs the library it hashed as a dependency, not whatever is installed, and the
checkout itself, so a model factory ``package.module:callable`` imports from the project root.
"""

from __future__ import annotations

import functools
import os
import signal
import sys
from pathlib import Path

CHECKOUT = Path(__file__).resolve().parents[1]
sys.path[:0] = [str(CHECKOUT / "src"), str(CHECKOUT)]

from ampbench.runtime import processes, signals  # noqa: E402  (standard library only: before the imports that take time)

# From here until the stage's body takes over (``stage``), a signal stops the stage with one line.
for _sig in (signal.SIGINT, signal.SIGTERM):
    if signal.getsignal(_sig) is not signal.SIG_IGN:  # `nohup`, `cmd &`: the caller asked us to ignore it
        signal.signal(_sig, signals.stopped_while_starting)

import click  # noqa: E402

from ampbench.cli import one_line  # noqa: E402
from ampbench.config import layout  # noqa: E402  (needs the path above)
from ampbench.config.user_code import first_line, user_frame  # noqa: E402
from ampbench.config.validation import load_params  # noqa: E402
from ampbench.errors import AmpbenchError, Interrupted, interrupted_line  # noqa: E402
from ampbench.runtime import provenance  # noqa: E402  (needs the path above)
from ampbench.tracking.uris import mask  # noqa: E402


def project_root() -> Path:
    """Where the MLflow store lives: the original project even when DVC runs us in a temporary copy."""
    return Path(os.environ.get("DVC_ROOT") or CHECKOUT).resolve()


def code_version(*user_code: str) -> str:
    """Hash of the library's source and of the user code, as checkpoints record it (``provenance.code_version``)."""
    return provenance.code_version(CHECKOUT, *user_code)


def run_tags() -> dict[str, str]:
    """Provenance tags for MLflow: git commit, DVC experiment and baseline (``provenance.run_tags``)."""
    return provenance.run_tags(CHECKOUT)


def relaunch_under_torchrun(nproc: int) -> None:
    """Replace this process with ``torchrun --standalone --nproc_per_node N`` running the same command."""
    args = [sys.executable, "-m", "torch.distributed.run", "--standalone", f"--nproc_per_node={nproc}",
            sys.argv[0], *sys.argv[1:]]
    click.echo(f"launching {nproc} processes: {' '.join(args[1:])}", err=True)
    sys.stdout.flush()
    os.execv(sys.executable, args)


def deterministic_cublas() -> None:
    """cuBLAS needs a fixed workspace for deterministic matmuls, set in the environment before CUDA starts."""
    from ampbench.runtime.determinism import CUBLAS_WORKSPACE_CONFIG

    os.environ.setdefault("CUBLAS_WORKSPACE_CONFIG", CUBLAS_WORKSPACE_CONFIG)


params_option = click.option(
    "--params", "params_path", type=click.Path(dir_okay=False, path_type=Path), default=Path("params.yaml"),
    show_default=True, help="params file to read (every stage validates the whole file first).")
debug_option = click.option("--debug", is_flag=True, envvar="AMPBENCH_DEBUG",
                            help="Show the full traceback on errors (under dvc: AMPBENCH_DEBUG=1 dvc repro).")


def folder_option(flag: str, dest: str, default: str | None, help: str):
    """A folder path option; every stage's inputs and outputs are overridable so tests can redirect them."""
    return click.option(flag, dest, type=click.Path(file_okay=False, path_type=Path),
                        default=None if default is None else Path(default), show_default=default is not None,
                        help=help)


data_option = folder_option("--data", "data_dir", str(layout.PREPARED),
                            "Prepared data folder (output of the prepare stage).")


def _restore_hint() -> str:
    """Under DVC, which deletes a stage's outputs before running it: how to get the previous ones back."""
    name = os.environ.get("DVC_STAGE")
    if not name or name == "check":  # the check stage's output holds nothing worth restoring
        return ""
    return (f" (DVC removed {name}'s previous outputs before running it: `dvc checkout {name}` restores them from "
            "its cache)")


def run(command) -> None:
    """A stage script's entry point (``if __name__ == "__main__": run(main)``): the click command, standalone; an
    interrupted stage's 130 is its exit status for sure (``signals.entry_point``)."""
    signals.entry_point(command)


def stage(fn):
    """Wrap a stage body: load and validate params first, and turn user errors into one line and exit 2."""

    @functools.wraps(fn)
    def wrapper(*args, params_path: Path, debug: bool, **kwargs):
        # SIGTERM (a scheduler, DVC's watch in processes.py) unwinds like Ctrl-C, once: temporary files are removed,
        # runs closed as KILLED, completed outputs kept; signals after the first are ignored.
        signals.handle_signals_once()
        owner = processes.dvc_ancestor()
        if owner is not None:
            processes.stop_when_gone(owner)
        try:
            with signals.interruptions_unwrapped():  # a signal's KeyboardInterrupt that C code wrapped in its error
                result = fn(*args, params=load_params(params_path), **kwargs)
            signals.settle()  # complete: a signal from here to the exit is said, and changes nothing
            return result
        except (AmpbenchError, OSError) as exc:  # OSError: unwritable folder, disk full, …: file and reason
            if debug:
                raise
            click.echo(one_line(exc) + _restore_hint(), err=True)
            sys.exit(2)
        except KeyboardInterrupt as exc:  # an Interrupted says what is kept; any other, in general
            if not getattr(exc, "kept", None):
                exc = Interrupted(exc.args[0] if exc.args else "SIGINT", "completed outputs are kept")
            click.echo(f"[{signals.stage_label()}] {interrupted_line(exc)}", err=True)
            sys.exit(130)
        except Exception as exc:  # noqa: BLE001  (an error in the user's model, data set or task code)
            where = None if debug else user_frame(exc)
            if where is None:  # ours, or --debug: the whole traceback
                raise
            click.echo(f"error: {type(exc).__name__}: {mask(first_line(exc))} — raised in your code at {where}; "
                       "the run is marked FAILED and the stage resumes from its last epoch once fixed; "
                       "--debug (or AMPBENCH_DEBUG=1 dvc repro) shows the whole traceback" + _restore_hint(), err=True)
            sys.exit(1)

    return wrapper
