"""What a sweeper that draws points as it goes (Optuna and the like) may draw, and which
way it searches.

Such a sweeper cannot be checked point by point up front, so before its study starts
the fixed overrides must run, and so must some combination of the finite dimensions
(an interval is tried at both ends, a long range at a sample of its values). Only where
every value of every dimension was checked does "no combination can run" stop the study:
a sample that cannot run is a warning. A point it draws later that cannot run is refused,
and the sweeper is told the worst value for its direction (:class:`Refused`), so the
study learns to avoid that region instead of stopping.
"""

from __future__ import annotations

import dataclasses
import itertools
import math
import sys
from collections.abc import Callable
from typing import Any

from omegaconf import DictConfig, OmegaConf

from art_hydra import moved
from art_hydra.config.hydra_compat import raw_list
from art_hydra.config.problems import Problem, Severity, errors, fix, format_report
from art_hydra.sweeps.points import ranks_per_job
from art_hydra.sweeps.reports import fail, sweep_report
from art_hydra.sweeps.sweeper_space import (
    MAX_COMBINATIONS,
    Sampled,
    is_optuna,
    optuna_space,
    sample,
)

log = moved.logger(__name__)  # the name it logged under before the move


class Refused(float):
    """The value a sweeper gets for a point that was not launched: the worst for its
    direction (so a study learns from it), with the problems that refused it."""

    problems: list[Problem]

    def __new__(cls, value: float, problems: list[Problem]) -> Refused:
        made = super().__new__(cls, value)
        made.problems = problems
        return made


def worst_value(config: DictConfig | None) -> float:
    """The worst objective for the sweep's direction: the sweeper's own setting where it
    has one (Optuna's ``hydra.sweeper.direction``), else ``objective.direction``."""
    direction = (
        OmegaConf.select(config, "hydra.sweeper.direction", default=None) if config else None
    )
    if direction is None and config is not None:
        direction = OmegaConf.select(config, "objective.direction", default="maximize")
    if isinstance(direction, (list, tuple)) or OmegaConf.is_list(direction):
        direction = direction[0] if len(direction) else "maximize"
    name = str(getattr(direction, "name", direction)).lower()
    return math.inf if name.endswith("minimize") else -math.inf


def check_search_space(config: DictConfig, checker: Callable[[], Any]) -> None:
    """Before the study starts: one direction, the one the objective is better in; every
    combination of the finite dimensions checked (up to :data:`MAX_COMBINATIONS`).
    Combinations that cannot run are named once, grouped by problem: the sweeper may
    draw them, and they will be refused, never launched. None can run: no study.
    ``checker`` gives the sweep's point checker, made only when there is something to check."""
    from art_hydra.config.launch_plan import planned_launch

    wrong_way = direction_problems(config)
    if wrong_way and config.get("strict", False):  # strict=true: a warning is fatal
        wrong_way = [dataclasses.replace(p, severity=Severity.error) for p in wrong_way]
    if errors(wrong_way):
        fail(format_report(errors(wrong_way), footer="The study was not started."))
    if wrong_way:
        sys.stderr.write(format_report(wrong_way) + "\n")
    fixed, dims = search_space(config)
    dims = fitted(dims)
    combos = combinations(dims)
    if combos is None:
        log.warning(
            "The search space has over %d combinations; each point is checked as it is drawn.",
            MAX_COMBINATIONS,
        )
        return
    points = [[*fixed, *combo] for combo in combos]
    made = checker()
    with planned_launch(ranks_per_job(config.hydra.launcher)):
        checked = [made.problems(point, 0) for point in points]
    invalid = [(i, points[i], p) for i, p in enumerate(checked) if errors(p)]
    if not invalid:
        return
    report = sweep_report(invalid, len(points), "combination", " of the search space")
    sampled = [key for key, values in dims if isinstance(values, Sampled)]
    if len(invalid) == len(points) and not sampled:
        fail(f"{report}\nNo combination of the search space can run; the study was not started.")
    if len(invalid) == len(points):
        log.warning(
            f"{report}\nNone of the checked combinations can run, but {', '.join(sampled)} "
            "was checked at a sample of its values, not every one: the study starts, and "
            "each drawn trial that cannot run is refused before launch, never run."
        )
        return
    log.warning(
        f"{report}\nThe sweeper may still draw these: such trials are refused before "
        "launch (the sweeper is given the worst value), never run."
    )


#: The sweeper's own direction (Optuna's), beside the run's ``objective.direction``.
DIRECTION = "hydra.sweeper.direction"


def direction_problems(config: DictConfig) -> list[Problem]:
    """A study that goes another way than the objective: several directions (each job
    returns one objective), or the other direction (maximising a loss). The study would
    run, but it cannot do what was meant: it would search for the worst runs while the
    sweep's summary ranks them the objective's way. Several directions, and the
    sweeper's own default (Optuna's ``minimize``, which the user never chose) going the
    other way, are refused before the first trial, like a point that cannot run; a
    direction the command line sets is the user's choice: the study runs as told, with a
    warning (``strict=true`` refuses it). Each names the override that makes them agree."""
    wanted = OmegaConf.select(config, DIRECTION, default=None)
    if wanted is None:
        return []
    spec = _objective(config)
    better = spec.direction if spec is not None else "maximize"
    if OmegaConf.is_list(wanted):
        if len(wanted) <= 1:
            return []
        return [
            Problem(
                DIRECTION,
                [str(getattr(w, "name", w)).lower() for w in wanted],
                f"has {len(wanted)} directions, but each art_hydra job returns one objective "
                "(objective.metric): every trial would train and then fail.",
                fix({DIRECTION: better}, "the objective's own direction"),
            )
        ]
    wanted = str(getattr(wanted, "name", wanted)).lower()
    if spec is None or wanted.endswith(spec.direction) or _varies_the_objective(config):
        return []
    given = any(
        str(o).lstrip("+~").split("=", 1)[0] == DIRECTION
        for o in raw_list(config.hydra.overrides.hydra)
    )
    return [
        Problem(
            DIRECTION,
            wanted,
            ("" if given else "is the sweeper's own default (hydra/sweeper=optuna brings it) and ")
            + f"goes the other way than the objective: {spec.metric} is better when it is "
            f"{'lower' if spec.direction == 'minimize' else 'higher'} (objective.direction "
            f"resolves to {spec.direction}), so the study would search for the worst runs "
            "while the sweep's summary ranks them best first.",
            fix(
                {DIRECTION: spec.direction},
                "search the objective's way",
                alt=fix({"objective.direction": wanted}, "if the objective is what is wrong"),
            ),
            severity=Severity.warning if given else Severity.error,
        )
    ]


def _varies_the_objective(config: DictConfig) -> bool:
    """Whether the search space varies what decides the objective's direction (each
    point's objective then says; the summary ranks like with like)."""
    _, dims = search_space(config)
    return any(key == "algorithm" or key.startswith(("objective", "algorithm.")) for key, _ in dims)


def _objective(config: DictConfig) -> Any:
    """The sweep's resolved objective (None where the config cannot tell: the points'
    own pre-flight reports why)."""
    from art_hydra.config.objective import resolve

    try:
        return resolve(config.objective, config.algorithm.name)
    except Exception:
        return None


def search_space(config: DictConfig) -> tuple[list[str], list[tuple[str, list[str]]]]:
    """``(fixed overrides, [(key, values to try)])`` of a sweep: the command line's task
    overrides and the sweeper's ``params``; a finite dimension gives its values, an
    interval its two ends. Optuna's study is read by Optuna's own parser
    (:func:`~art_hydra.sweeps.sweeper_space.optuna_space`)."""
    if is_optuna(config):
        return optuna_space(config)
    from hydra.core.override_parser.overrides_parser import OverridesParser
    from hydra.core.override_parser.types import IntervalSweep

    texts = raw_list(config.hydra.overrides.task)
    params = OmegaConf.select(config, "hydra.sweeper.params", default=None)
    if isinstance(params, DictConfig):
        texts += [f"{k}={v}" for k, v in OmegaConf.to_container(params, resolve=False).items()]
    fixed: list[str] = []
    dims: dict[str, list[str]] = {}
    for override in OverridesParser.create().parse_overrides(texts):
        key = override.get_key_element()
        if not override.is_sweep_override():
            fixed.append(override.input_line)
            continue
        sweep = override.value()
        if isinstance(sweep, IntervalSweep):
            low, high = sweep.start, sweep.end
            if all(float(v).is_integer() for v in (low, high)) and "int" in str(
                getattr(sweep, "tags", "")
            ):
                low, high = int(low), int(high)
            dims[key] = Sampled([f"{key}={low}", f"{key}={high}"])
        else:
            dims[key] = [f"{key}={v}" for v in override.sweep_string_iterator()]
    fixed = [f for f in fixed if f.split("=", 1)[0].lstrip("+~") not in dims]
    return fixed, list(dims.items())


def fitted(dims: list[tuple[str, list[str]]]) -> list[tuple[str, list[str]]]:
    """The dimensions, the longest ones cut to a :class:`Sampled` few (both ends kept)
    until their combinations fit :data:`MAX_COMBINATIONS` (or each has two values left)."""
    dims = list(dims)
    while math.prod(max(len(v), 1) for _, v in dims) > MAX_COMBINATIONS:
        i = max(range(len(dims)), key=lambda j: len(dims[j][1]))
        key, values = dims[i]
        if len(values) <= 2:
            break
        others = math.prod(max(len(v), 1) for j, (_, v) in enumerate(dims) if j != i)
        dims[i] = (key, sample(values, min(len(values) - 1, max(2, MAX_COMBINATIONS // others))))
    return dims


def combinations(dims: list[tuple[str, list[str]]]) -> list[list[str]] | None:
    """Every combination of the dimensions' values (None: more than
    :data:`MAX_COMBINATIONS`, too many to check up front)."""
    total = 1
    for _, values in dims:
        total *= max(len(values), 1)
    if total > MAX_COMBINATIONS:
        return None
    return [list(c) for c in itertools.product(*(values for _, values in dims))]
