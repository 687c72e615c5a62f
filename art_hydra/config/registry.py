"""The validator registry.

A validator is a plain function that receives the composed, resolved config and
returns (or yields) :class:`~art_hydra.config.problems.Problem` objects; it is
registered with the :func:`validator` decorator. Third-party packages add validators
without any change to art_hydra by declaring an entry point in the
``art_hydra.validators`` group that names either a decorated function or a module
whose import registers some::

    [project.entry-points."art_hydra.validators"]
    my_checks = "my_pkg.checks"

Every registered validator runs on every config, and their findings are collected, not
raised one at a time, so the user gets one report with every problem.
"""

from __future__ import annotations

import functools
from collections.abc import Callable, Iterable
from importlib.metadata import entry_points
from typing import Any

from omegaconf import DictConfig
from omegaconf.errors import MissingMandatoryValue

from art_hydra.config.problems import Kind, Problem, fix

#: Entry-point group through which other packages contribute validators.
ENTRY_POINT_GROUP = "art_hydra.validators"

ValidatorFn = Callable[[DictConfig], Iterable[Problem] | None]

_validators: dict[str, ValidatorFn] = {}
_plugins_loaded = False
_plugin_problems: list[Problem] = []


def validator(fn: ValidatorFn | None = None, *, name: str | None = None) -> Any:
    """Register ``fn`` as a validator; usable bare (``@validator``) or with a name."""

    def register(f: ValidatorFn) -> ValidatorFn:
        _validators[name or f"{f.__module__}.{f.__qualname__}"] = f
        return f

    return register(fn) if fn is not None else register


def registered_validators() -> dict[str, ValidatorFn]:
    """Built-in and entry-point validators (plugins are loaded once per process)."""
    _load_plugins()
    return dict(_validators)


@functools.cache
def plugin_modules() -> tuple[str, ...]:
    """Modules of installed validator plugins: code the user chose by installing it."""
    return tuple(ep.value.partition(":")[0] for ep in entry_points(group=ENTRY_POINT_GROUP))


def _load_plugins() -> None:
    global _plugins_loaded
    if _plugins_loaded:
        return
    _plugins_loaded = True
    for ep in entry_points(group=ENTRY_POINT_GROUP):
        try:
            obj = ep.load()
        except Exception as exc:  # a broken plugin must not silently stop checking
            _plugin_problems.append(
                Problem(
                    f"entry point {ENTRY_POINT_GROUP}:{ep.name}",
                    ep.value,
                    f"the validator plugin failed to import: {type(exc).__name__}: {exc}",
                    fix(note=f"repair or uninstall the package that provides '{ep.value}'"),
                    Kind.plugin,
                )
            )
            continue
        if callable(obj) and obj not in _validators.values():
            validator(obj, name=f"{ep.name}:{ep.value}")


def run_validators(cfg: DictConfig) -> list[Problem]:
    """Run every validator on ``cfg`` and collect what they find.

    A validator that reads a value still missing (reported by the structure check) is
    skipped; one that crashes becomes a problem of its own rather than a traceback, so
    the report stays complete.
    """
    validators = registered_validators()
    problems = list(_plugin_problems)
    for name, fn in validators.items():
        try:
            problems.extend(fn(cfg) or ())
        except MissingMandatoryValue:
            continue
        except Exception as exc:
            problems.append(
                Problem(
                    f"validator {name}",
                    type(exc).__name__,
                    f"the validator crashed: {exc}",
                    fix(note="fix the validator, or uninstall the package that registers it"),
                    Kind.plugin,
                )
            )
    return problems
