"""The pre-flight's reports: how a refused sweep, point or sweep folder is told."""

# No `from __future__ import annotations` (see preflight_sweeper.py).
import dataclasses
import sys
from collections.abc import Iterable
from pathlib import Path
from typing import Any

from hydra.errors import CompactHydraException

from art_hydra.config.problems import Problem, errors
from art_hydra.errors import full_error


class SweepPreflightError(CompactHydraException):
    """Some sweep points cannot run; the message lists each with its problems."""


def _fail(message: str) -> None:
    """Report a user's mistake without a traceback or Hydra's HYDRA_FULL_ERROR hint."""
    if full_error():
        raise SweepPreflightError(message)
    sys.stderr.write(message.rstrip() + "\n")
    sys.exit(1)


def refuse_a_used_sweep_folder(config: Any) -> None:
    """A sweep folder that holds another sweep stops the sweep before anything is written."""
    from art_hydra.config.problems import format_report
    from art_hydra.preflight import sweep_folder_problems

    found = sweep_folder_problems(Path(config.hydra.sweep.dir), config)
    if errors(found):
        _fail(format_report(found, footer="No job was launched."))


#: Points listed by number and overrides in a pre-flight report (the rest are counted).
LISTED_POINTS = 20


def _sweep_report(
    invalid: list[tuple[int, list[str], list[Problem]]],
    total: int,
    noun: str = "sweep point",
    of: str = "",
) -> str:
    """The invalid points, then each distinct problem once, with the points it stops."""
    head = "Point" if noun == "sweep point" else noun.split()[0].capitalize()
    parts = [f"Pre-flight: {len(invalid)} of {total} {noun}(s){of} cannot run."]
    parts += [
        f"{head} #{index}: {' '.join(point) or '(no overrides)'}"
        for index, point, _ in invalid[:LISTED_POINTS]
    ]
    if len(invalid) > LISTED_POINTS:
        parts.append(f"... and {len(invalid) - LISTED_POINTS} more, numbered below.")
    groups = _grouped((index, errors(problems)) for index, _, problems in invalid)
    parts.append(f"{len(groups)} distinct problem(s), each with the {noun}s it stops:")
    parts += _group_lines(groups, noun)
    return "\n".join(parts)


def _grouped(
    found: Iterable[tuple[int, list[Problem]]],
) -> list[tuple[Problem, list[int]]]:
    """Each distinct problem (key, reason, fix) once, with the points it concerns; where
    its value differs between them, the value shown says so."""
    groups: dict[tuple[str, str, str], tuple[Problem, list[int], set[str]]] = {}
    for index, problems in found:
        for problem in problems:
            key = (problem.key, problem.reason, str(problem.fix))
            _, indices, values = groups.setdefault(key, (problem, [], set()))
            indices.append(index)
            values.add(repr(problem.value))
    return [
        (
            dataclasses.replace(first, value=f"{first.value} (varies by point)")
            if len(values) > 1
            else first,
            list(dict.fromkeys(indices)),
        )
        for first, indices, values in groups.values()
    ]


def _group_lines(groups: list[tuple[Problem, list[int]]], noun: str) -> list[str]:
    lines = []
    for number, (problem, indices) in enumerate(groups, 1):
        where = ", ".join(f"#{i}" for i in indices[:50])
        more = f" and {len(indices) - 50} more" if len(indices) > 50 else ""
        lines.append(f"{problem.render(number)}\n     in {len(indices)} {noun}(s): {where}{more}")
    return lines


def _warning_report(warned: list[tuple[int, list[str], list[Problem]]], total: int) -> str:
    """Warnings of valid points, each distinct one once with the points it concerns."""
    parts = [
        f"Pre-flight: {len(warned)} of {total} sweep point(s) run with warnings "
        "(strict=true makes them fatal):"
    ]
    parts += _group_lines(_grouped((i, problems) for i, _, problems in warned), "sweep point")
    return "\n".join(parts)
