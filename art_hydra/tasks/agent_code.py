"""The task's agent code: the environment class (``task.environment._target_``) and the
tool functions (``task.tools``), resolved through the trust rules as rewards are.

A config file may name only an environment class marked ``@environment`` and tool
functions marked ``@tool`` (``from art_hydra import environment, tool``); the command
line, or ``task.allowed_modules`` given on it, may name any (see
:mod:`art_hydra.config.targets`). Nothing is instantiated here: the run makes one
environment per rollout with the entry's other keys (:func:`environment_kwargs`).
"""

from __future__ import annotations

import inspect
from collections.abc import Callable
from typing import Any

from art_hydra.tasks.base import resolve_task_code
from art_hydra.tasks.examples import Example, TaskDataError

#: The key that names the environment class.
ENVIRONMENT_KEY = "task.environment._target_"


def environment_path(task_cfg: Any) -> str | None:
    """The dotted class ``task.environment._target_`` names (None: no environment)."""
    entry = task_cfg.get("environment") if hasattr(task_cfg, "get") else None
    target = entry.get("_target_") if entry else None
    return str(target) if target else None


def environment_kwargs(task_cfg: Any) -> dict[str, Any]:
    """The entry's other keys: the environment's constructor arguments (as Hydra's
    ``instantiate`` would pass them)."""
    from omegaconf import DictConfig, OmegaConf

    entry = task_cfg.get("environment") or {}
    plain = OmegaConf.to_container(entry, resolve=True) if isinstance(entry, DictConfig) else entry
    return {str(k): v for k, v in dict(plain).items() if k != "_target_"}


def tool_keys(task_cfg: Any) -> list[str]:
    """``task.tools.N`` for each tool function named."""
    return [f"task.tools.{i}" for i in range(len(task_cfg.get("tools") or ()))]


def uses_agent_code(task_cfg: Any) -> bool:
    """Whether the task names an environment or tools (a multi-turn tool-using task)."""
    return bool(task_cfg.get("environment")) or bool(task_cfg.get("tools"))


def resolve_agent_code(task_cfg: Any) -> tuple[type | None, list[Callable[..., Any]]]:
    """The environment class (None: no ``task.environment``) and the tool functions of
    ``task.tools``, each resolved through the trust rules; :class:`TaskDataError` naming
    the key (``task.environment._target_``, ``task.tools.1``) when one may not or cannot
    be used. An environment entry without ``_target_`` is an error too (composition
    refuses it first)."""
    env_class: type | None = None
    if task_cfg.get("environment"):
        if environment_path(task_cfg) is None:
            raise TaskDataError(
                f"{ENVIRONMENT_KEY}: task.environment is set without _target_, the class to "
                "make one environment per rollout from"
            )
        env_class = resolve_task_code(task_cfg, ENVIRONMENT_KEY)
    tools = [resolve_task_code(task_cfg, key) for key in tool_keys(task_cfg)]
    return env_class, tools


def reset_row(example: Example) -> dict[str, Any]:
    """The row ``reset`` is given, as TRL gives it: the row's columns, its prompt (the
    messages as dicts for a conversational row, else the text) and its answer."""
    row: dict[str, Any] = dict(example.columns)
    if example.messages:
        row["prompt"] = [{"role": r, "content": c} for r, c in example.messages]
    else:
        row["prompt"] = example.prompt
    if example.answer is not None:
        row["answer"] = example.answer
    return row


def reset_arguments(method: Any, row: dict[str, Any]) -> dict[str, Any]:
    """The keys of ``row`` that ``method`` takes (all of them when it takes ``**kwargs``)."""
    try:
        params = inspect.signature(method).parameters.values()
    except (TypeError, ValueError):
        return row
    if any(p.kind is p.VAR_KEYWORD for p in params):
        return row
    names = {p.name for p in params if p.kind in (p.POSITIONAL_OR_KEYWORD, p.KEYWORD_ONLY)}
    return {k: v for k, v in row.items() if k in names}
