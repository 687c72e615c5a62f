"""The validators and world checks of one sweep point, each remembered by what it read
(:mod:`art_hydra.sweeps.read_trace`): a point that changes only values re-runs only the
checks that read one of them.

The validators run as :func:`~art_hydra.config.composition.rule_problems` runs them on a
config without problems of its own (every registered validator in order, a missing value
skipped, a crash reported by name, all errors under ``strict``); the world checks run
through :func:`~art_hydra.preflight.runner.environment_problems` itself, each handed out
remembered. Tests compare these verdicts with a full check's over varied grids.
"""

from __future__ import annotations

import functools
from collections.abc import Iterator
from dataclasses import replace
from typing import Any

from omegaconf import DictConfig

from art_hydra.config import composition
from art_hydra.config.problems import Problem
from art_hydra.config.validator_registry import ValidatorFn, run_one_validator
from art_hydra.preflight.runner import environment_problems
from art_hydra.preflight.world_check_registry import WorldCheck, adapted_checks
from art_hydra.sweeps.read_trace import Memo


def rule_problems(typed: DictConfig, memo: Memo) -> list[Problem]:
    """Every validator's findings on ``typed``, as the single run's check gives them, each
    validator answered from ``memo`` where the values it read are unchanged."""

    def remembered(name: str, fn: ValidatorFn, cfg: DictConfig) -> list[Problem]:
        return memo.call(f"validator {name}", functools.partial(run_one_validator, name, fn, cfg))

    return composition.rule_problems(typed, [], remembered)


def world_problems(
    typed: DictConfig, memo: Memo, devices_here: bool, failed: frozenset[str]
) -> list[Problem]:
    """The world checks' findings on ``typed`` (those reading a ``failed`` key skipped)."""

    def remembered(check: WorldCheck) -> WorldCheck:
        @functools.wraps(check.fn)
        def run(*args: Any) -> Iterator[Problem]:
            # A generator, so that what a check yielded before it raised still reaches
            # the runner, as it does from the check itself.
            got: list[Problem] = []

            def collect() -> list[Problem]:
                got.extend(check.fn(*args) or ())
                return got

            try:
                verdict = memo.call(f"world {check.name} {args[1:]!r}", collect)
            except Exception:
                yield from got
                raise
            yield from verdict

        return replace(check, fn=run)

    with adapted_checks(remembered):
        return environment_problems(typed, devices_here, failed)
