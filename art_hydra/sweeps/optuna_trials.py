"""An Optuna study's ``n_trials`` counts trials that ran, not points it was refused.

The Optuna sweeper asks its study for a batch of trials, fixes each trial's point, hands
the batch to the launcher and counts the batch against ``n_trials``. Behind the
pre-flight launcher a point that cannot run is refused there, so a study over a space
that is half invalid trained half its ``n_trials``. Here the sweeper's step that fixes
the points (``_configure_trials``, reached through
:func:`art_hydra.config.hydra_compat.wrap_optuna_trials`) checks each trial's point first:
one that cannot run is told to its study with the worst value for each direction (so the
sampler learns to avoid the region, as before), recorded under
``<sweep dir>/refused/<k>/result.json`` (it never gets a job number; a point already
recorded there, drawn again by a study continued with ``resume=auto``, is not recorded
twice, so the folder holds each refused point once), and replaced in the
batch by a fresh trial of the same study, until the point passes. The sweeper then
launches and counts only trials that run.

Bound: at most :data:`REFUSALS_PER_TRIAL` x ``n_trials`` refusals in a study; past that
the space is mostly invalid, and the study stops with what was refused and why. A grid
sampler is asked again only while its grid keeps an undrawn point for each trial still
to come (it would repeat points): past that, a refused grid point is refused by the
launcher as before, under a job number, so each grid point is tried once.
"""

from __future__ import annotations

import contextlib
import math
import os
from collections import Counter
from collections.abc import Callable, Sequence
from pathlib import Path
from typing import Any

from art_hydra import moved
from art_hydra.config.problems import Problem, errors, format_report
from art_hydra.sweeps.reports import fail, overrides_text

log = moved.logger(__name__)

#: Refused trials a study may meet per trial of its ``hydra.sweeper.n_trials``.
REFUSALS_PER_TRIAL = 10
#: Where the refused trials of a study are recorded, under its sweep folder.
REFUSED_DIR = "refused"


def configure_trials(
    original: Callable[..., Sequence[Sequence[str]]],
    sweeper: Any,
    trials: list[Any],
    space: dict[str, Any],
    fixed: dict[str, Any],
) -> Sequence[Sequence[str]]:
    """The sweeper's ``_configure_trials``, each refused trial replaced in ``trials`` (in
    place: the sweeper tells its results by position) by one whose point can run."""
    launches = getattr(getattr(sweeper, "launcher", None), "launches", None)
    overrides = [list(o) for o in original(sweeper, trials, space, fixed)]
    if launches is None or launches.config is None or launches.config.get("dry_run", False):
        return overrides  # a dry run reports the first batch as drawn
    bound = REFUSALS_PER_TRIAL * int(sweeper.n_trials)
    for i in range(len(trials)):
        num = int(sweeper.job_idx) + i
        while True:
            problems = launches.trial_problems(overrides[i], num)
            still_to_ask = int(sweeper.n_trials) - launches.launched - len(trials)
            if not errors(problems) or not _more_to_draw(trials[i].study, still_to_ask):
                break
            _refuse(launches, trials[i], overrides[i], problems)
            if len(launches.refused_trials) >= bound:
                _stop(launches, trials, i, sweeper.n_trials)
            trials[i] = trials[i].study.ask()
            overrides[i] = list(original(sweeper, [trials[i]], space, fixed)[0])
    return overrides


def worst_values(study: Any) -> list[float]:
    """The worst value for each of the study's directions."""
    return [
        math.inf if str(getattr(d, "name", d)).lower().endswith("minimize") else -math.inf
        for d in study.directions
    ]


def _refuse(launches: Any, trial: Any, point: list[str], problems: list[Problem]) -> None:
    """Tell the trial its worst values, record it under ``refused/``, and say so."""
    try:
        trial.study.tell(trial, values=worst_values(trial.study))
    except RuntimeError as exc:  # a grid sampler stopping its study outside optimize()
        if "Study.stop" not in str(exc):
            raise
    launches.refused_trials.append((trial.number, point, problems))
    causes = "; ".join(f"{p.key} = {p.value}" for p in errors(problems))
    launches._record_the_sweep()  # the folder is this sweep's before its first record
    folder = _record(Path(str(launches.config.hydra.sweep.dir)), trial, point, problems, causes)
    where = f"see {folder}/result.json; " if folder else ""
    log.warning(
        f"Trial {trial.number} of the study was not launched ({causes}; {where}another is "
        f"drawn, and it does not count against hydra.sweeper.n_trials): {overrides_text(point)}"
    )


def _record(
    sweep_dir: Path, trial: Any, point: list[str], problems: list[Problem], causes: str
) -> Path | None:
    """``<sweep dir>/refused/<k>/result.json``, as the launcher records a refused point."""
    from art_hydra.engine.result import write_refused_result

    parent = sweep_dir / REFUSED_DIR
    known = _recorded(parent, point)
    if known is not None:  # a continued study (resume=auto) drew it again: one record
        return known
    k = 0
    while os.path.lexists(parent / str(k)):
        k += 1
    header = f"Trial {trial.number} of the study was not launched ({causes}):"
    text = format_report(errors(problems), header=header, footer=None)
    try:
        write_refused_result(parent / str(k), point, text, None)
    except OSError as exc:
        log.warning("could not record refused trial %d in %s: %s", trial.number, parent, exc)
        return None
    return parent / str(k)


#: Overrides that say how a study starts, never which point it is (a resumed study's
#: draws carry ``resume=auto``): left out when telling a point already recorded.
_NOT_A_POINT = ("resume", "dry_run")


def _point_key(point: Sequence[str]) -> frozenset[str]:
    """A point's overrides without those that only say how it was started."""
    return frozenset(
        o
        for o in point
        if o.lstrip("+~").split("=", 1)[0] not in _NOT_A_POINT
        and not o.lstrip("+~").startswith("hydra.")
    )


def _recorded(parent: Path, point: list[str]) -> Path | None:
    """The ``refused/<k>`` already recording this point (a continued study asks its
    sampler again and may draw it again), or None."""
    import json

    wanted = _point_key(point)
    for path in parent.glob("*/result.json") if parent.is_dir() else ():
        try:
            record = json.loads(path.read_text())
        except (OSError, ValueError):
            continue
        if isinstance(record, dict) and _point_key(record.get("overrides") or []) == wanted:
            return path.parent
    return None


def _more_to_draw(study: Any, still_to_ask: int) -> bool:
    """Whether the study may be asked for one more trial: always, except for a grid
    sampler, whose grid must keep an undrawn point for each trial the sweeper has still
    to ask (Hydra caps ``n_trials`` at the grid's size; past it the sampler repeats
    points)."""
    sampler = study.sampler
    if type(sampler).__name__ != "GridSampler":
        return True
    total = len(getattr(sampler, "_all_grids", ()))
    drawn = {
        t.system_attrs.get("grid_id")
        for t in study.get_trials(deepcopy=False)
        if "grid_id" in t.system_attrs
    }
    return total - len(drawn) >= 1 + max(still_to_ask, 0)


def _stop(launches: Any, trials: list[Any], current: int, n_trials: int) -> None:
    """The bound is hit: the batch's other trials are failed (none was launched) and the
    study stops with what was refused."""
    import optuna

    for i, trial in enumerate(trials):
        if i != current:
            with contextlib.suppress(Exception):  # a grid study stopping outside optimize()
                trial.study.tell(trial, state=optuna.trial.TrialState.FAIL)
    fail(
        f"The study stopped: {len(launches.refused_trials)} drawn trials were refused "
        f"({REFUSALS_PER_TRIAL} x hydra.sweeper.n_trials={n_trials}, the bound), "
        f"{launches.launched} launched. What refused them:\n{_causes(launches.refused_trials)}\n"
        "Most of the search space cannot run: narrow it to values that can (each refused "
        f"trial's reasons are in {launches.config.hydra.sweep.dir}/{REFUSED_DIR}/<k>/result.json)."
    )


def _causes(refused: list[tuple[int, list[str], list[Problem]]]) -> str:
    """One line per refusing key: how many trials it refused, with its first values."""
    counts: Counter[str] = Counter()
    values: dict[str, list[str]] = {}
    for _, _, found in refused:
        for p in errors(found):
            counts[p.key] += 1
            seen = values.setdefault(p.key, [])
            if str(p.value) not in seen:
                seen.append(str(p.value))
    return "\n".join(
        f"  {count} x {key} (values {', '.join(values[key][:5])}"
        f"{', ...' if len(values[key]) > 5 else ''})"
        for key, count in counts.most_common()
    )
