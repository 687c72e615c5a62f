"""The world-check registry: what the world pre-flight runs, beside ``@validator``.

A world check is a function that receives the resolved config and returns (or yields)
:class:`~art_hydra.config.problems.Problem` objects about files and the environment
(data, model folders, installed libraries, devices), still before any model loads and
without importing torch. It is registered with :func:`world_check`, naming the config
sections it reads: a check is skipped when composition already refused a key of one of
them and left it without a readable value, and a sweep's pre-flight checks again only
the points that change one of them.

art_hydra's own checks (task, model, backend, trackers, eval) register in
:mod:`art_hydra.preflight.runner` in the order they report; other packages add theirs through
the ``art_hydra.world_checks`` entry-point group of an installed distribution (a
decorated function, or a module whose import registers some), or a launcher script
imports its module before ``art_hydra.commands.cli.main()``. A check that fails to import or
crashes is reported by name.
"""

from __future__ import annotations

from collections.abc import Callable, Iterable, Iterator
from contextlib import contextmanager
from contextvars import ContextVar
from dataclasses import dataclass
from typing import Any

from art_hydra.config.plugin_registry import PluginRegistry
from art_hydra.config.problems import Kind, Problem, fix

#: Entry-point group through which other packages contribute world checks.
ENTRY_POINT_GROUP = "art_hydra.world_checks"

CheckFn = Callable[..., Iterable[Problem] | None]


@dataclass(frozen=True)
class WorldCheck:
    """One registered check and the top-level config sections it reads."""

    name: str
    fn: CheckFn
    reads: tuple[str, ...]
    #: Called as ``fn(cfg, devices_here)``: it looks at this machine's devices, which a
    #: launcher that runs jobs elsewhere (SLURM) leaves to the job.
    devices: bool = False

    @property
    def builtin(self) -> bool:
        return getattr(self.fn, "__module__", "").startswith("art_hydra.")


#: art_hydra's checks register as :mod:`art_hydra.preflight.runner` loads, first; plugins
#: on first use, after them.
REGISTRY: PluginRegistry[WorldCheck] = PluginRegistry(
    ENTRY_POINT_GROUP, ("art_hydra.preflight.runner",), "world-check"
)


def world_check(
    fn: CheckFn | None = None,
    *,
    reads: tuple[str, ...],
    name: str | None = None,
    devices: bool = False,
) -> Any:
    """Register ``fn`` as a world check reading the config sections ``reads``
    (``@world_check(reads=("task",))``); ``devices=True`` passes ``devices_here``."""

    def register(f: CheckFn) -> CheckFn:
        key = name or f"{f.__module__}.{f.__qualname__}"
        REGISTRY.registered[key] = WorldCheck(key, f, tuple(reads), devices)
        return f

    return register(fn) if fn is not None else register


#: How checks are handed out while :func:`adapted_checks` is active (a sweep's pre-flight
#: remembers each check's verdict by the values it read).
_ADAPT: ContextVar[Callable[[WorldCheck], WorldCheck] | None] = ContextVar(
    "art_hydra_adapt_world_checks", default=None
)


def registered_world_checks() -> dict[str, WorldCheck]:
    """Built-in and plugin world checks, in registration order (plugins loaded once)."""
    checks = REGISTRY.entries()
    adapt = _ADAPT.get()
    return checks if adapt is None else {name: adapt(c) for name, c in checks.items()}


@contextmanager
def adapted_checks(adapt: Callable[[WorldCheck], WorldCheck]) -> Iterator[None]:
    """Hand every check out through ``adapt`` while inside, wherever the checks are run
    from: the loop that runs them stays the one a single run uses."""
    token = _ADAPT.set(adapt)
    try:
        yield
    finally:
        _ADAPT.reset(token)


def plugin_problems() -> list[Problem]:
    """World-check plugins that failed to import, as problems."""
    return REGISTRY.load_problems()


def crashed(check: WorldCheck, exc: Exception) -> Problem:
    """A plugin check that raised, reported by name instead of a traceback."""
    return Problem(
        f"world check {check.name}",
        type(exc).__name__,
        f"the world check crashed: {exc}",
        fix(note="fix the check, or uninstall the package that registers it"),
        Kind.plugin,
    )
