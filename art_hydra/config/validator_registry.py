"""The validator registry.

A validator is a plain function that receives the composed, resolved config and
returns (or yields) :class:`~art_hydra.config.problems.Problem` objects; it is
registered with the :func:`validator` decorator. Third-party packages add validators
without any change to art_hydra by declaring an entry point in the
``art_hydra.validators`` group that names a function (registered under the entry
point's name unless it is decorated) or a module whose import registers some::

    [project.entry-points."art_hydra.validators"]
    my_checks = "my_pkg.checks"

Every registered validator runs on every config, and their findings are collected, not
raised one at a time, so the user gets one report with every problem. Loading and the
report of a plugin that fails to import are :class:`PluginRegistry`'s, as for the other
registries users extend; entry points are read from installed distributions only (a
``*.dist-info`` lying in the working folder is data, not an install).
"""

from __future__ import annotations

from collections.abc import Callable, Iterable
from importlib.metadata import EntryPoint
from typing import Any

from omegaconf import DictConfig
from omegaconf.errors import MissingMandatoryValue

from art_hydra.config.plugin_registry import PluginRegistry
from art_hydra.config.problems import Kind, Problem, fix

#: Entry-point group through which other packages contribute validators.
ENTRY_POINT_GROUP = "art_hydra.validators"

ValidatorFn = Callable[[DictConfig], Iterable[Problem] | None]


def _adopt(ep: EntryPoint, obj: Any) -> None:
    """An entry point that names a plain function registers it under the entry point's
    name; one naming a decorated function or a module has registered already."""
    if callable(obj) and obj not in REGISTRY.registered.values():
        validator(obj, name=f"{ep.name}:{ep.value}")


#: art_hydra's validators register as :mod:`art_hydra.config.validators` (and the modules
#: it imports) load, first; plugins on first use, after them.
REGISTRY: PluginRegistry[ValidatorFn] = PluginRegistry(
    ENTRY_POINT_GROUP, ("art_hydra.config.validators",), "validator", adopt=_adopt
)


def validator(fn: ValidatorFn | None = None, *, name: str | None = None) -> Any:
    """Register ``fn`` as a validator; usable bare (``@validator``) or with a name."""

    def register(f: ValidatorFn) -> ValidatorFn:
        REGISTRY.registered[name or f"{f.__module__}.{f.__qualname__}"] = f
        return f

    return register(fn) if fn is not None else register


def registered_validators() -> dict[str, ValidatorFn]:
    """Built-in and entry-point validators (plugins are loaded once per process)."""
    return REGISTRY.entries()


#: How one validator is run: :func:`run_one_validator`, or a wrapper of it (the sweep
#: pre-flight answers from memory where the values a validator read are unchanged).
RunOne = Callable[[str, ValidatorFn, DictConfig], list[Problem]]


def run_validators(cfg: DictConfig, run_one: RunOne | None = None) -> list[Problem]:
    """Run every validator on ``cfg`` and collect what they find.

    A validator that reads a value still missing (reported by the structure check) is
    skipped; one that crashes becomes a problem of its own rather than a traceback, so
    the report stays complete.
    """
    problems = REGISTRY.load_problems()
    for name, fn in registered_validators().items():
        problems.extend((run_one or run_one_validator)(name, fn, cfg))
    return problems


def run_one_validator(name: str, fn: ValidatorFn, cfg: DictConfig) -> list[Problem]:
    """What one validator finds on ``cfg``: what it yielded before a missing value or a
    crash is kept, and a crash is a problem of its own (the sweep pre-flight runs each
    validator through this too, so both ways report alike)."""
    problems: list[Problem] = []
    try:
        problems.extend(fn(cfg) or ())
    except MissingMandatoryValue:
        pass
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
