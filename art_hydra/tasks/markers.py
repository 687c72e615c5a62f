"""The markers that make code eligible as a reward, a generator, an environment or a tool.

A config file (perhaps one from elsewhere) may name only code written to be one: a
function (or reward class) carrying ``@reward`` or ``@generator``, an environment class
carrying ``@environment``, a tool function carrying ``@tool`` (see
:mod:`art_hydra.config.targets`). All are exported at the top level::

    from art_hydra import environment, generator, reward, tool

    @reward(needs_answer=True)          # or plain @reward
    def exact(prompt: str, completion: str, answer: str | None) -> float: ...

    @generator
    def pairs(rng, num_examples, length=3): ...

    @environment
    class Lookup:                       # task.environment._target_=mymod.Lookup
        def reset(self, **row): ...
        def lookup(self, key: str) -> str: ...   # a tool: its docstring (with an
                                                 # Args: section) is its description

    @tool
    def add(a: int, b: int) -> int: ...  # task.tools=[mymod.add], a docstring too

A reward is called as ``reward(prompt=..., completion=..., answer=...)`` and a generator
as ``generator(rng=..., num_examples=..., **task.params)``: by parameter name.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any, TypeVar, overload

from art_hydra.config.targets import ROLE_ATTR

F = TypeVar("F", bound=Callable[..., Any])


@overload
def reward(fn: F, *, needs_answer: bool | None = None) -> F: ...
@overload
def reward(fn: None = None, *, needs_answer: bool | None = None) -> Callable[[F], F]: ...
def reward(fn: Any = None, *, needs_answer: bool | None = None) -> Any:
    """Mark ``fn`` as a reward; ``needs_answer`` says whether it scores against each
    example's reference answer (None: judged from its ``answer`` annotation, see
    :func:`art_hydra.tasks.rewards.needs_answer`)."""

    def mark(f: F) -> F:
        setattr(f, ROLE_ATTR, "reward")
        if needs_answer is not None:
            f.needs_answer = needs_answer  # type: ignore[attr-defined]
        return f

    return mark(fn) if fn is not None else mark


def generator(fn: F) -> F:
    """Mark ``fn`` as an example generator, ``fn(rng, num_examples, **task.params)``."""
    setattr(fn, ROLE_ATTR, "generator")
    return fn


C = TypeVar("C", bound=type)


def environment(cls: C) -> C:
    """Mark ``cls`` as an environment class (TRL's ``environment_factory`` shape: one
    instance per rollout, ``reset(**row)``, its public methods the tools)."""
    setattr(cls, ROLE_ATTR, "environment")
    return cls


def tool(fn: F) -> F:
    """Mark ``fn`` as a tool function the model may call (``task.tools``)."""
    setattr(fn, ROLE_ATTR, "tool")
    return fn
