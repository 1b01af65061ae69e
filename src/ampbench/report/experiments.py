"""Compare verdicts across DVC experiments or git revisions: what changed in params, what changed in results.

Reads params and ``reports/comparison.json`` at each revision through ``dvc.api`` (experiment names, branches,
tags and commits all work; ``workspace`` means the files on disk).
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

# The per-arm columns shown side by side.
COLUMNS = ("not_worse", "verdict", "delta_accuracy_pp", "delta_accuracy_pp_bound", "delta_accuracy_pp_ci_low",
           "delta_accuracy_pp_ci_high", "speedup_vs_fp32", "memory_vs_fp32", "skipped_steps")


def _flatten(d: dict, prefix: str = "") -> dict[str, Any]:
    out: dict[str, Any] = {}
    for k, v in d.items():
        key = f"{prefix}.{k}" if prefix else str(k)
        out.update(_flatten(v, key) if isinstance(v, dict) else {key: v})
    return out


def load_revision(rev: str, repo: str = ".") -> dict[str, Any]:
    """{"params": flat params, "arms": per-arm rows of comparison.json and speed.json} at ``rev``."""
    import dvc.api

    from ampbench.errors import AmpbenchError

    api_rev = None if rev == "workspace" else rev
    try:
        params = dvc.api.params_show(repo=repo, rev=api_rev)
    except Exception as exc:  # dvc raises many types for an unknown rev
        raise AmpbenchError(f"cannot read revision {rev!r}: {type(exc).__name__}: {exc}") from None
    arms: dict[str, dict] = {}
    for path in ("reports/comparison.json", "reports/speed.json"):
        try:  # dvc.api resolves targets against the working directory, not the repo: pass them absolute
            table = dvc.api.metrics_show(str(Path(repo).resolve() / path), repo=repo, rev=api_rev)
        except Exception:  # absent at this revision (older layout, or evaluate never ran there)
            continue
        for arm, row in table.items():
            if isinstance(row, dict):
                arms.setdefault(arm, {}).update(row)
    return {"params": _flatten(params), "arms": arms}


def compare_revisions(revs: list[str], repo: str = ".") -> dict[str, Any]:
    """Params that differ between the revisions, and each arm's result columns per revision."""
    loaded = {rev: load_revision(rev, repo) for rev in revs}
    keys = sorted(set().union(*(d["params"] for d in loaded.values())))
    changed = {k: {rev: d["params"].get(k) for rev, d in loaded.items()} for k in keys
               if len({repr(d["params"].get(k)) for d in loaded.values()}) > 1}
    arms = list(dict.fromkeys(a for d in loaded.values() for a in d["arms"]))
    results = {arm: {rev: {c: d["arms"].get(arm, {}).get(c) for c in COLUMNS} for rev, d in loaded.items()}
               for arm in arms}
    return {"revisions": revs, "changed_params": changed, "arms": results}


def _cell(row: dict[str, Any]) -> str:
    if row.get("verdict") is None:
        return "—"  # the arm did not run at this revision, or the revision predates verdicts
    text = str(row["verdict"])
    if row.get("not_worse") is not None and row["not_worse"] != "baseline":  # older revisions have none
        text = f"{row['not_worse']} (equivalence: {row['verdict']})"
    if row.get("delta_accuracy_pp") is not None:
        text += f", Δacc {row['delta_accuracy_pp']:+.2f} pp"
        if row.get("delta_accuracy_pp_bound") is not None:
            text += f" (one-sided bound {row['delta_accuracy_pp_bound']:+.2f})"
        elif row.get("delta_accuracy_pp_ci_low") is not None:  # a revision from before the not-worse verdict
            text += f" [{row['delta_accuracy_pp_ci_low']:+.2f}, {row['delta_accuracy_pp_ci_high']:+.2f}]"
    if row.get("speedup_vs_fp32") is not None:
        text += f", {row['speedup_vs_fp32']:.2f}× speed"
    return text


def markdown(result: dict[str, Any]) -> str:
    """Two tables: changed params (one column per revision), then each arm's verdict per revision."""
    revs = result["revisions"]
    head = "| | " + " | ".join(f"`{r}`" for r in revs) + " |\n|---|" + "---|" * len(revs) + "\n"
    out = ["## What changed in params", ""]
    if result["changed_params"]:
        out.append(head + "".join(f"| {k} | " + " | ".join(str(v.get(r)) for r in revs) + " |\n"
                                  for k, v in result["changed_params"].items()))
    else:
        out.append("Nothing: the revisions have identical params.\n")
    out += ["## What changed in the results (not worse? and equivalence, Δaccuracy vs fp32 with its one-sided bound, "
            "speed vs fp32)", ""]
    out.append(head + "".join(f"| {arm} | " + " | ".join(_cell(per_rev[r]) for r in revs) + " |\n"
                              for arm, per_rev in result["arms"].items()))
    return "\n".join(out)
