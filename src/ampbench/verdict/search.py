"""Which modules to keep in float32 for a degraded arm: a search over the sensitivity ranking with trainings judged by
the pipeline's verdicts, then one confirmation on fresh seeds (issue 52). Pure logic: the trainings and their
verdicts come from a ``judge`` the caller gives; no files, no MLflow.

Why this search. The ranking (``training/sensitivity.py``) orders the candidates by how much of the arm's output
error keeping each one in float32 removes, so the answer is most likely a short prefix of it. *Growth* doubles the
prefix (1, 2, 4, … candidates: about log2 of them in trials to the first prefix that passes), a *bisection* between
the longest prefix that failed and the shortest that passed shortens it, and *elimination* then tries the set
without each member in turn, the lowest-ranked first, dropping the members it does not need. Nothing assumes that
more float32 is better: every set the search ends with was itself trained and judged, a prefix that fails after a
shorter one passed is only a failed trial, and a set is called *minimal* only when removing each of its members was
tried on that very set and failed (for a single module: the arm as it was, which the run already judged).

The search's verdicts choose; they do not report. It tries many sets, so one may pass by luck: each trial's false
*not worse* rate is the verdict's alpha, and the chance that some trial of a search passes falsely is larger. The
set the search ends with is therefore trained once more on fresh seeds the search never used, and that
confirmation's verdict alone is reported. It is one test at alpha on data independent of the choice, so the whole
procedure's false *not worse* rate stays at alpha (``tests/test_fix_search.py`` simulates both rates).

The budget counts the arm's trainings (a trial on k seeds costs k), the confirmation's included: its seeds are set
aside when the search starts. When the rest is spent, the search stops and says what it learnt.

A trial, the confirmation too, looks as ``ampbench decide`` does (``judged_in_looks``): after each added seed from
``evaluate.sequential.min_seeds`` on, at that look's levels of the group-sequential design
(``verdict/sequential.py``), stopping at the first look that decides it, so a clear pass or a clear failure costs
fewer trainings. The design's repeated bounds hold at every look, so the confirmation's verdict keeps its alpha
wherever it stopped. The budget is charged for the seeds a trial used.
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from typing import Callable

from ampbench.verdict.sequential import UNDECIDED, Design, Look

NOT_WORSE = "not worse"


@dataclass(frozen=True)
class Trial:
    """One training of the arm with ``modules`` kept in float32 on ``seeds``, judged against fp32 on the same seeds
    (``verdict``: the pipeline's verdict the search asks for, ``goal`` the one that passes: *not worse*, or
    *equivalent* where asked; ``low``/``high``: its interval on the difference, None when it has none)."""

    modules: tuple[str, ...]
    seeds: tuple[int, ...]
    verdict: str
    low: float | None = None
    high: float | None = None
    goal: str = NOT_WORSE

    @property
    def passed(self) -> bool:
        return self.verdict == self.goal


Judge = Callable[[tuple[str, ...], tuple[int, ...]], Trial]


@dataclass(frozen=True)
class Answer:
    """Where a search ended. ``modules``: the set it ended with (None when no set it tried passed); ``minimal``: each
    member's removal was tried on it and failed; ``confirmation``: that set on the fresh seeds (its verdict is the
    one to report; None when there was no set); ``best``: with no set, the trial whose interval came closest to
    passing; ``trials``: every trial in order, the confirmation last; ``spent``: trainings; ``stopped``: why, in
    words."""

    modules: tuple[str, ...] | None
    minimal: bool
    confirmation: Trial | None
    best: Trial | None
    trials: list[Trial]
    spent: int
    stopped: str

    @property
    def confirmed(self) -> bool:
        return self.confirmation is not None and self.confirmation.passed

    def fields(self) -> dict:
        """The set and whether it was confirmed, as the search's record stores them."""
        return {"modules": list(self.modules) if self.modules else None, "confirmed": self.confirmed}


def trial_design(seeds: int, min_seeds: int, spending: str, confidence: float) -> Design | None:
    """The looks of a trial on ``seeds`` seeds: one after each added seed from ``min_seeds`` (at least 2) to all of
    them; None (a single look at every seed, the fixed design) when that leaves no earlier look."""
    first = max(2, min_seeds)
    return Design(first, seeds, spending, confidence) if first < seeds else None


def judged_in_looks(seeds: tuple[int, ...], design: Design | None,
                    judge_at: Callable[[tuple[int, ...], Look | None], Trial]) -> Trial:
    """A trial judged at each look of ``design`` on its first seeds (``judge_at(seeds so far, look)``; all seeds at
    once without a design), stopping at the first look whose verdict is decided; its ``seeds``: those it used."""
    for look in design.looks() if design else [None]:
        trial = judge_at(seeds[:look.seeds] if look else seeds, look)
        if trial.verdict not in UNDECIDED:
            break
    return trial


def default_budget(candidates: int, seeds: int, fresh: int) -> int:
    """Trainings for a search over ``candidates`` with ``seeds`` per trial and ``fresh`` confirmation seeds: three
    trials per halving of the candidates (growth, bisection, elimination of a short set) and the confirmation."""
    return 3 * max(1, math.ceil(math.log2(candidates + 1))) * seeds + fresh


class _Trials:
    """The search's trials within its budget: each set (in any order) is trained once; None once the budget would
    be overdrawn."""

    def __init__(self, judge: Judge, seeds: tuple[int, ...], budget: int):
        self.judge, self.seeds, self.left = judge, seeds, budget
        self.done: dict[frozenset[str], Trial] = {}
        self.order: list[Trial] = []

    def __call__(self, modules: tuple[str, ...]) -> Trial | None:
        key = frozenset(modules)
        if key in self.done:
            return self.done[key]
        if self.left < len(self.seeds):
            return None
        self.left -= len(self.seeds)
        trial = self.judge(modules, self.seeds)
        self.left += len(self.seeds) - len(trial.seeds)  # a look that decided early spent fewer
        self.done[key] = trial
        self.order.append(trial)
        return trial

    def failed(self, modules: tuple[str, ...]) -> bool:
        trial = self.done.get(frozenset(modules))
        return trial is not None and not trial.passed


@dataclass
class _State:
    """The set a search has so far, and why it stopped early (empty while it has not)."""

    found: tuple[str, ...] | None = None
    stopped: str = ""


def search(ranking: list[str], judge: Judge, seeds: tuple[int, ...], fresh: tuple[int, ...],
           budget: int) -> Answer:
    """Search ``ranking`` (candidate modules, most promising first) for a set to keep in float32 under which the
    arm's trials pass (not worse, or equivalent: the judge's ``Trial.goal``; see the module docstring); ``seeds``
    for the search's trials, ``fresh`` (none of them) for the confirmation; ``budget`` in trainings. ValueError for
    what no search can run on."""
    if not ranking:
        raise ValueError("no candidate module to keep in float32")
    if not seeds or not fresh or set(seeds) & set(fresh):
        raise ValueError(f"the search's seeds {list(seeds)} and the confirmation's {list(fresh)} must be given and "
                         "disjoint: the confirmation needs seeds the search never saw")
    if budget < len(seeds) + len(fresh):
        raise ValueError(f"a budget of {budget} trainings pays for no trial and its confirmation (at least "
                         f"{len(seeds) + len(fresh)}: {len(seeds)} seeds per trial and {len(fresh)} fresh ones)")
    trials = _Trials(judge, tuple(seeds), budget - len(fresh))
    state = _State()
    _grow_and_bisect(ranking, trials, state)
    minimal = False
    if state.found is not None:
        minimal = _eliminate(trials, state)
    spent = budget - len(fresh) - trials.left
    if state.found is None:
        tried = list(trials.done.values())
        best = max(tried, key=lambda t: -math.inf if t.low is None else t.low, default=None)
        return Answer(None, False, None, best, trials.order, spent, state.stopped)
    confirmation = judge(state.found, tuple(fresh))
    stopped = state.stopped or (("minimal: without it the arm is as the run judged it" if len(state.found) == 1 else
                                 "minimal: removing any one of its modules made the arm fail") if minimal else
                                "sufficient")
    return Answer(state.found, minimal, confirmation, None, [*trials.order, confirmation],
                  spent + len(confirmation.seeds), stopped)


def _grow_and_bisect(ranking: list[str], trials: _Trials, state: _State) -> None:
    """Prefixes of 1, 2, 4, … candidates until one passes, then a bisection between the longest that failed and
    it; ``state.found``: the shortest prefix that passed (None: none did, ``state.stopped`` says why)."""
    n, k, failed, passed = len(ranking), 1, 0, None
    while passed is None:
        k = min(k, n)
        trial = trials(tuple(ranking[:k]))
        if trial is None:
            state.stopped = (f"the budget ran out while growing the set: the first {failed} ranked module(s) kept "
                             "in float32 were not enough" if failed else "the budget ran out before any trial")
            return
        if trial.passed:
            passed = k
        elif k == n:
            state.stopped = (f"no set helps: with all {n} candidate modules kept in float32 the arm is still "
                             f"{trial.verdict}")
            return
        else:
            failed, k = k, 2 * k
    while passed - failed > 1:
        mid = (failed + passed) // 2
        trial = trials(tuple(ranking[:mid]))
        if trial is None:
            state.stopped = f"sufficient; the budget ran out while shortening it ({passed} modules)"
            break
        failed, passed = (failed, mid) if trial.passed else (mid, passed)
    state.found = tuple(ranking[:passed])


def _eliminate(trials: _Trials, state: _State) -> bool:
    """Drop, lowest-ranked first, each member of ``state.found`` whose removal still passes; True when the set is
    minimal (each member's removal from it tried and failed; a single module's is the arm as it was)."""
    found = state.found
    dropped = True
    while dropped and len(found) > 1:
        dropped = False
        for member in reversed(found):
            without = tuple(m for m in found if m != member)
            trial = trials(without)
            if trial is None:
                state.found = found
                state.stopped = state.stopped or (f"sufficient; the budget ran out while removing members "
                                                  f"({len(found)} modules, not shown minimal)")
                return False
            if trial.passed:
                found, dropped = without, True
                break
    state.found = found
    return len(found) == 1 or all(trials.failed(tuple(m for m in found if m != member)) for member in found)
