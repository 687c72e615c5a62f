"""The advantage-estimator registry: the names ``rl.advantage_estimator`` accepts.

An advantage estimator is one function, registered where it is defined with
:func:`register_advantage_estimator` (re-exported by :mod:`art_hydra.engine.rl.advantages`,
where the built-in ``group_relative`` registers the same way)::

    @register_advantage_estimator("leave_one_out", help="RLOO's baseline")
    def leave_one_out(group, scale, eps):
        n = len(group)
        return [r - (sum(group) - r) / (n - 1) for r in group]

It receives the rewards of one prompt's completions (``rl.num_generations`` of them),
``rl.scale_rewards`` and a small ``eps`` for divisions, and returns one advantage per
completion, in order. :func:`art_hydra.engine.rl.advantages.group_advantages` splits a
generation batch into groups, calls the chosen estimator on each and flags the groups
whose rewards are all equal (the ``zero_std_groups`` metric).

Estimators come from three places, loaded once per process before the first lookup:
art_hydra's own (:data:`BUILTIN_MODULES`), installed packages through the
``art_hydra.advantage_estimators`` entry-point group (a module whose import registers
some), and any module a launcher script imported before calling ``art_hydra.commands.cli.main()``.

This module is on the compose/validate path: it imports nothing heavier than the
standard library.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

from art_hydra.config.plugin_registry import PluginRegistry

#: Entry-point group through which other packages contribute advantage estimators.
ENTRY_POINT_GROUP = "art_hydra.advantage_estimators"

#: art_hydra's own estimator modules, loaded as a plugin would be (torch-free).
BUILTIN_MODULES = ("art_hydra.engine.rl.advantages",)


@dataclass(frozen=True)
class AdvantageEstimator:
    """One registered estimator: ``fn(group, scale, eps)`` -> one advantage per reward."""

    name: str
    fn: Callable[..., Any]
    help: str
    module: str


REGISTRY: PluginRegistry[AdvantageEstimator] = PluginRegistry(
    ENTRY_POINT_GROUP, BUILTIN_MODULES, "advantage estimator"
)
_estimators = REGISTRY.registered


def register_advantage_estimator(
    name: str, *, help: str = ""
) -> Callable[[Callable[..., Any]], Callable[..., Any]]:
    """Register the decorated function as ``rl.advantage_estimator=name``; ``help``: one
    line for reports (default: the docstring's first sentence)."""

    def register(fn: Callable[..., Any]) -> Callable[..., Any]:
        module = getattr(fn, "__module__", "")
        old = _estimators.get(name)
        if old is not None and (old.module, old.fn.__qualname__) != (module, fn.__qualname__):
            raise ValueError(
                f"advantage estimator {name!r} is registered twice: by "
                f"{old.module}.{old.fn.__qualname__} and by {module}.{fn.__qualname__}"
            )
        doc = help or " ".join((fn.__doc__ or "").split()).partition(". ")[0]
        _estimators[name] = AdvantageEstimator(name, fn, doc, module)
        return fn

    return register


def advantage_estimators() -> dict[str, AdvantageEstimator]:
    """Every registered estimator by name (built-ins first, then plugins, in load order)."""
    return REGISTRY.entries()


def get_advantage_estimator(name: Any) -> AdvantageEstimator | None:
    """The estimator registered as ``name``, or None."""
    return REGISTRY.get(name)
