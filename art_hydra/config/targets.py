"""Dotted targets (rewards, generators) resolve only to code the user chose.

A config value that names a function is code the run will execute, so it resolves
through an allowlist of module prefixes: art_hydra's own, the modules of installed
validator plugins, and what the user lists in ``task.allowed_modules``. Standard-library
modules are never allowed (``os.execlp``, ``subprocess.getoutput``, ``builtins.eval``),
and the object found must be a plain Python function whose own module is allowed, so a
re-export of ``os.system`` from an allowed module is refused too. The prefix check needs
no import and runs at composition; importing and checking the object runs in the world
pre-flight.
"""

from __future__ import annotations

import importlib
import importlib.util
import inspect
import re
import sys
from collections.abc import Iterable
from typing import Any

from art_hydra.config.registry import plugin_modules

#: Modules whose functions targets may always name.
BUILTIN_PREFIXES = ("art_hydra",)

_DOTTED = re.compile(r"^[A-Za-z_]\w*(\.[A-Za-z_]\w*)+$")


class TargetError(ValueError):
    """A target that may not or cannot be used; the message says why and what to do."""


def allowed_prefixes(extra: Iterable[str]) -> tuple[str, ...]:
    return (*BUILTIN_PREFIXES, *plugin_modules(), *(str(p) for p in extra))


def _under(module: str, prefix: str) -> bool:
    return module == prefix or module.startswith(prefix + ".")


def _stdlib(module: str) -> bool:
    top = module.partition(".")[0]
    return top in sys.stdlib_module_names or top in sys.builtin_module_names


def refusal(path: str | None, key: str, allowed: tuple[str, ...]) -> str | None:
    """Why ``path`` may not be used as ``key`` (None when it may); imports nothing."""
    if path is None or not _DOTTED.match(str(path)):
        return f"must be the dotted path of a function (module.function), not {path!r}."
    module = str(path).rpartition(".")[0]
    if _stdlib(module):
        return (
            f"names the standard-library module '{module}'; a {key.rpartition('.')[2]} runs "
            "as part of training, so only your own modules may be named."
        )
    if not any(_under(module, p) for p in allowed):
        return (
            f"names the module '{module}', which is not allowed to run: targets resolve only "
            f"under {', '.join(allowed)}. Add your module to task.allowed_modules to allow it."
        )
    return None


def resolve(path: str, key: str, allowed: tuple[str, ...]) -> Any:
    """Import and return the function ``path`` names, or raise :class:`TargetError`."""
    why = refusal(path, key, allowed)
    if why is not None:
        raise TargetError(why)
    module_name, _, attr = path.rpartition(".")
    try:
        found = importlib.util.find_spec(module_name) is not None
    except (ImportError, ValueError):
        found = False
    if not found:
        raise TargetError(f"no module named '{module_name}' is installed or on sys.path.")
    try:
        module = importlib.import_module(module_name)
    except Exception as exc:
        raise TargetError(f"importing '{module_name}' failed: {type(exc).__name__}: {exc}") from exc
    obj = getattr(module, attr, None)
    if obj is None:
        raise TargetError(f"module '{module_name}' has no attribute '{attr}'.")
    if not inspect.isfunction(obj):
        raise TargetError(
            f"is a {type(obj).__name__}, not a plain Python function defined in your code."
        )
    home = obj.__module__ or ""
    if _stdlib(home) or not any(_under(home, p) for p in allowed):
        raise TargetError(
            f"is '{home}.{obj.__qualname__}' re-exported from '{module_name}'; its own module "
            f"'{home}' is not allowed to run."
        )
    return obj
