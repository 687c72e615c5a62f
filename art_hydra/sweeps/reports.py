"""How the sweep pre-flight tells what stops a sweep: points or combinations that cannot
run (each distinct problem once, with the points it stops), a used sweep folder, jobs
that did not finish, a job that failed on another machine. Each is the user's report
alone, without a traceback, so a grid of a thousand points stays readable."""

from __future__ import annotations

import dataclasses
import sys
from collections.abc import Iterable
from pathlib import Path
from typing import Any, NoReturn

from hydra.errors import CompactHydraException

from art_hydra.config.problems import Problem, errors
from art_hydra.errors import full_error


class SweepPreflightError(CompactHydraException):
    """Some sweep points cannot run; the message lists each with its problems."""


def fail(message: str) -> NoReturn:
    """Report a user's mistake without a traceback or Hydra's HYDRA_FULL_ERROR hint."""
    if full_error():
        raise SweepPreflightError(message)
    sys.stderr.write(message.rstrip() + "\n")
    sys.exit(1)


def refuse_a_used_sweep_folder(config: Any) -> None:
    """A sweep folder that holds another sweep, or that another live sweep holds, stops
    the sweep before anything is written. The folder is checked (reading only: a refused
    path gets no lock file), its lock taken, and checked again while held, so a sweep
    ending between the first check and the claim cannot hand its folder to another; a
    sweep refused then lets the folder go at once."""
    from art_hydra.config.problems import format_report
    from art_hydra.preflight import sweep_folder_problems
    from art_hydra.preflight.sweep_folder import claim_sweep_folder, release_sweep_folder

    folder = Path(config.hydra.sweep.dir)
    found = sweep_folder_problems(folder, config)
    if not errors(found) and not config.get("dry_run", False):  # held until the sweep ends
        found = claim_sweep_folder(folder, str(config.hydra.sweep.dir))
        if not errors(found):
            found = sweep_folder_problems(folder, config)
            if errors(found):
                release_sweep_folder(folder)
    if errors(found):
        fail(format_report(found, "The sweep cannot launch here:", "No job was launched."))


def refuse_a_launcher_that_cannot_start(config: Any) -> None:
    """A launcher that could not start a job here (``hydra/launcher=slurm`` off a SLURM
    cluster) stops the sweep before anything is checked, written or launched; a dry run,
    which launches nothing, is told and goes on."""
    from omegaconf import OmegaConf

    from art_hydra.config.launch_plan import launcher_problems
    from art_hydra.config.problems import Severity, format_report

    choices = OmegaConf.select(config, "hydra.runtime.choices", default=None) or {}
    found = launcher_problems(config.hydra.launcher, choices.get("hydra/launcher"))
    if not found:
        return
    if not config.get("dry_run", False):
        fail(format_report(found, "The sweep cannot launch here:", "No job was launched."))
    told = [dataclasses.replace(p, severity=Severity.warning) for p in found]
    sys.stderr.write(format_report(told, "dry run: the sweep itself could not launch:") + "\n")


def overrides_text(point: list[str]) -> str:
    """A point as its command line would say it."""
    return " ".join(point) or "(no overrides)"


def numbers(nums: list[int]) -> str:
    return ", ".join(f"#{n}" for n in nums)


#: Points listed by number and overrides in a pre-flight report (the rest are counted).
LISTED_POINTS = 20


def sweep_report(
    invalid: list[tuple[int, list[str], list[Problem]]],
    total: int,
    noun: str = "sweep point",
    of: str = "",
) -> str:
    """The invalid points, then each distinct problem once, with the points it stops."""
    head = "Point" if noun == "sweep point" else noun.split()[0].capitalize()
    parts = [f"Pre-flight: {len(invalid)} of {total} {noun}(s){of} cannot run."]
    parts += [
        f"{head} #{index}: {overrides_text(point)}" for index, point, _ in invalid[:LISTED_POINTS]
    ]
    if len(invalid) > LISTED_POINTS:
        parts.append(f"... and {len(invalid) - LISTED_POINTS} more, numbered below.")
    groups = _grouped((index, errors(problems)) for index, _, problems in invalid)
    parts.append(f"{len(groups)} distinct problem(s), each with the {noun}s it stops:")
    parts += _group_lines(groups, noun)
    return "\n".join(parts)


def warning_report(warned: list[tuple[int, list[str], list[Problem]]], total: int) -> str:
    """Warnings of valid points, each distinct one once with the points it concerns."""
    parts = [
        f"Pre-flight: {len(warned)} of {total} sweep point(s) run with warnings "
        "(strict=true makes them fatal):"
    ]
    parts += _group_lines(_grouped((i, problems) for i, _, problems in warned), "sweep point")
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


def fail_if_unfinished(outcomes: dict[int, str]) -> None:
    """Exit 1 if a job failed or was killed (the summary printed before names each, with
    why); refused points are not jobs that failed."""
    failed = sorted(n for n, why in outcomes.items() if not why.startswith("refused"))
    if failed:
        fail(f"{len(failed)} job(s) of the sweep did not finish: {numbers(failed)}.")


def remote_failure(text: str) -> str:
    """The gist of a failed submitit job: the error its task raised (the trace's last
    line, without the exception's module path) and where its full logs are; or, for a
    task that died without a result, submitit's account of it and its last output."""
    if "has not produced any output" in text:
        account, _, tail = text.partition("-" * 40)
        last = [f"  | {line}" for line in tail.strip().splitlines()[-6:]]
        return "\n".join(
            [
                account.strip(),
                "The task's process died (killed, out of memory, or a crash in native "
                "code); its last output:",
                *last,
            ]
        )
    trace, _, rest = text.partition("----------------------\n")[2].partition(
        "----------------------"
    )
    lines = [line for line in trace.splitlines() if line.strip()]
    last = lines[-1] if lines else text.splitlines()[0]
    # A message spans lines after its "module.Error: " head; keep it whole.
    for i in range(len(lines) - 1, -1, -1):
        head = lines[i].split(":", 1)[0]
        if head and " " not in head and not lines[i].startswith(" "):
            last = "\n".join([lines[i].split(": ", 1)[-1], *lines[i + 1 :]])
            break
    logs = [line.strip()[2:] for line in rest.splitlines() if line.strip().startswith("- ")]
    where = f"\nFull logs: {', '.join(logs)}" if logs else ""
    return f"{last}{where}"
