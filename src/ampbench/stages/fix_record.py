"""What an ``ampbench fix`` search leaves in reports/fix/: ``<arm>.md`` (``<arm>.equivalent.md``) to read, and the
same as ``.json`` for the evaluate stage, which puts every record into report.md's "Which part needs float32"
section (reports/fix is a dependency of that stage in dvc.yaml, so `dvc repro` after a search rewrites only the
report); and which run a record belongs to (``identity``)."""

from __future__ import annotations

from pathlib import Path
from typing import Any

from ampbench.config.params import TrainParams
from ampbench.report.fix import record, report_section
from ampbench.runtime.files import atomic_write_json, atomic_write_text, json_digest, read_json
from ampbench.runtime.provenance import code_version


def run_parts(root: Path, data_md5: str, tp: TrainParams) -> dict[str, Any]:
    """What a search's trainings depend on besides the sets they keep in float32 and their seeds: the prepared data's
    digest (``dvc_md5``), the code's, and the train params with train.fp32_modules left out (the search chooses it)."""
    train = tp.to_dict()
    train["fp32_modules"] = []
    return {"data": data_md5, "code": code_version(root, tp.model_code, tp.task_code), "train": train}


def identity(parts: dict[str, Any]) -> str:
    """A run's identity (``run_parts``) in 16 hex digits: a record of the same identity searched this run, or this
    run without its train.fp32_modules."""
    return json_digest(parts, 16)


def write_record(folder: Path, stem: str, fields: dict[str, Any]) -> Path:
    """``fields`` (arm, goal, identity, opening, ranking, tried, said, modules, confirmed) as ``<stem>.md`` and
    ``<stem>.json`` in ``folder``; the Markdown file's path."""
    path = folder / f"{stem}.md"
    atomic_write_text(path, record(fields["arm"], fields["opening"], fields["ranking"], fields["tried"],
                                   fields["said"]))
    atomic_write_json(folder / f"{stem}.json", {**fields, "record": path.name})
    return path


def read_records(folder: Path) -> list[dict[str, Any]]:
    """Every search's record in ``folder`` (none when it does not exist), by file name; a damaged one is a DataError
    naming it."""
    if not folder.is_dir():
        return []
    return [read_json(p, "write it again with `ampbench fix`") for p in sorted(folder.glob("*.json"))]


def section(reports_dir: Path, root: Path, data_md5: str, tp: TrainParams) -> list[str]:
    """report.md's section on the searches recorded in ``reports_dir``/fix, for the run of ``tp`` on the prepared
    data of digest ``data_md5`` (``report.fix.report_section``)."""
    records = read_records(reports_dir / "fix")
    return report_section(records, identity(run_parts(root, data_md5, tp)), tp.fp32_modules) if records else []
