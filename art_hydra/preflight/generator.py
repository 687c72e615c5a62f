"""The task's generator, checked before any model: it resolves through the trust rules
(a config file may name only a marked function), leaves art_hydra's own arguments
(``rng``, ``num_examples``) to art_hydra, and accepts its call with ``task.params`` by
parameter name, so a generator that cannot run is named before the run, not at step 1.
"""

from __future__ import annotations

import inspect
import random
from typing import Any

from omegaconf import DictConfig

from art_hydra.config.problems import Fix, Problem, fix, placeholder
from art_hydra.config.targets import ROLE_OF_KEY, NotMarkedError, TargetError
from art_hydra.errors import raised
from art_hydra.preflight.common import world_problem
from art_hydra.tasks.base import resolve_task_code
from art_hydra.tasks.examples import TaskDataError


def _code(cfg: DictConfig, key: str) -> tuple[Any, list[Problem]]:
    """The reward or generator ``key`` names, or why it may not or cannot run: a config
    file may name only a marked function (see :mod:`art_hydra.config.targets`)."""
    path = cfg.task.reward._target_ if key == "task.reward._target_" else cfg.task.generator
    try:
        return resolve_task_code(cfg.task, key), []
    except TaskDataError as exc:
        cause = exc.__cause__
        reason = str(cause) if isinstance(cause, TargetError) else str(exc)
        role = ROLE_OF_KEY[key]
        remedy = (
            fix(
                {key: path},
                f"on the command line, if you trust it; or mark it @{role} "
                f"(from art_hydra import {role})",
            )
            if isinstance(cause, NotMarkedError)
            else fix({key: placeholder("module.function")})
        )
        return None, [world_problem(key, path, reason, remedy)]


def _signature_problems(fn: Any, key: str, kwargs: dict[str, Any], what: str) -> list[Problem]:
    """Whether ``fn`` can be called by parameter name with ``kwargs`` (``what`` spells
    the call for the message)."""
    try:
        signature = inspect.signature(fn)
    except ValueError:
        return []  # no signature to inspect: the call itself will tell
    try:
        signature.bind(**kwargs)
    except TypeError as exc:
        own = ", ".join(signature.parameters)
        return [
            world_problem(
                key,
                f"{fn.__module__}.{fn.__qualname__}",
                f"does not accept the call {what}: arguments are passed by parameter name, "
                f"and its parameters are ({own}) ({exc}).",
                _params_fix(signature, key, kwargs, what),
            )
        ]
    return []


def _params_fix(signature: inspect.Signature, key: str, kwargs: dict[str, Any], what: str) -> Any:
    """Drop the ``task.params`` arguments the generator does not take (the user's own
    overrides of them); for a reward, or a generator missing what art_hydra passes, its
    parameters must change."""
    takes_any = any(p.kind == p.VAR_KEYWORD for p in signature.parameters.values())
    extra = [k for k in kwargs if k not in signature.parameters]
    passed = {"rng", "num_examples"}
    if key == "task.generator" and extra and not takes_any and not passed & set(extra):
        return fix(
            note=f"drop the task.params argument(s) it does not take: {', '.join(extra)}",
            drops=tuple(f"task.params.{k}" for k in extra),
            alt=fix(note=f"name its parameters as in {what}"),
        )
    return fix(note=f"name its parameters as in {what}")


def generator_problems(cfg: DictConfig) -> list[Problem]:
    """The generator resolves, is not given art_hydra's own arguments in task.params, and
    accepts its call."""
    task = cfg.task
    generator, problems = _code(cfg, "task.generator")
    if generator is None:
        return problems
    params = dict(task.params)
    taken = sorted({"rng", "num_examples"} & set(params))
    if taken:
        return [
            *problems,
            world_problem(
                f"task.params.{taken[0]}",
                params[taken[0]],
                "is an argument art_hydra gives every generator itself (rng is seeded "
                "from seed, num_examples is task.num_examples).",
                fix(
                    note=f"drop task.params.{taken[0]} (~task.params.{taken[0]})",
                    drops=(f"task.params.{taken[0]}",),
                ),
            ),
        ]
    names = "".join(f", {k}=..." for k in params)
    return problems + _signature_problems(
        generator,
        "task.generator",
        {"rng": random.Random(0), "num_examples": 1, **params},
        f"generator(rng=..., num_examples=...{names}) (task.params)",
    )


#: Plain values a fix can set back on the command line.
_PLAIN = (str, int, float, bool, type(None))


def failure_problem(cfg: DictConfig, generator: Any, exc: BaseException) -> Problem:
    """The generator raised ``exc`` on ``task.params``: blamed on the params the user
    changed from the generator's own defaults when, with those defaults back, it runs
    (tried here, with the same seed and count); else on the generator itself."""
    params = dict(cfg.task.params)
    try:
        signature = inspect.signature(generator)
    except (TypeError, ValueError):
        signature = None
    defaults = {
        name: p.default
        for name, p in (signature.parameters.items() if signature is not None else ())
        if p.default is not inspect.Parameter.empty
    }
    changed = [k for k, v in params.items() if k in defaults and v != defaults[k]]
    if changed:
        kept = {k: v for k, v in params.items() if k not in changed}
        try:
            for _ in generator(
                rng=random.Random(cfg.seed), num_examples=cfg.task.num_examples, **kept
            ):
                pass
        except Exception:
            changed = []  # it fails with its defaults too: the params are not the cause
    if not changed:
        given = ", ".join(f"{k}={v!r}" for k, v in params.items())
        return world_problem(
            "task.generator",
            cfg.task.generator,
            f"raised {raised(exc)}"
            + (f" (called with its defaults besides task.params: {given})" if given else ""),
            fix(note="fix the generator"),
        )
    shown = ", ".join(f"task.params.{k}={params[k]!r}" for k in changed)
    back = ", ".join(f"{k}={defaults[k]!r}" for k in changed)
    return world_problem(
        f"task.params.{changed[0]}",
        params[changed[0]],
        f"makes the generator {cfg.task.generator} raise {raised(exc)}; with its default "
        f"{back} instead of {shown} it runs, so the value is the cause.",
        _defaults_fix(changed, defaults),
    )


def _defaults_fix(changed: list[str], defaults: dict[str, Any]) -> Fix:
    """The generator's own defaults back: set on the command line when they are plain
    values, else the user's overrides dropped."""
    keys = tuple(f"task.params.{k}" for k in changed)
    drop = fix(note="keeps the generator's defaults", drops=keys)
    if all(isinstance(defaults[k], _PLAIN) for k in changed):
        return fix({f"task.params.{k}": defaults[k] for k in changed}, alt=drop)
    return drop
