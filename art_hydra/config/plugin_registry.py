"""What the registries users extend share: named entries added by art_hydra's own
modules and by installed plugins, loaded once, on first use.

Policy losses, backends and advantage estimators each keep their own entry type and
``register_*`` function; this holds the part that is the same for all three, so a
fourth registry is its entry type and one ``PluginRegistry(...)`` line. Torch-free:
the compose/validate path reads these registries.
"""

from __future__ import annotations

import difflib
import importlib
from importlib.metadata import entry_points
from typing import Any, Generic, TypeVar

T = TypeVar("T")


class PluginRegistry(Generic[T]):
    """Entries by name. Loading imports ``builtin_modules`` (first, in order), then every
    entry point of ``group``; an entry point that fails to import is kept as a load error,
    which validation reports, instead of a traceback."""

    def __init__(self, group: str, builtin_modules: tuple[str, ...]) -> None:
        self.group = group
        self.builtin_modules = builtin_modules
        #: What has registered so far, without loading (``register_*`` reads it: loading
        #: from inside a registration would import the registering module again).
        self.registered: dict[str, T] = {}
        self._loaded = False
        self._load_errors: list[tuple[str, str]] = []

    def _load(self) -> None:
        if self._loaded:
            return
        self._loaded = True
        for module in self.builtin_modules:
            importlib.import_module(module)
        for ep in entry_points(group=self.group):
            try:
                ep.load()
            except Exception as exc:  # reported by validation, not a traceback
                self._load_errors.append((f"{self.group}:{ep.name}={ep.value}", repr(exc)))

    def entries(self) -> dict[str, T]:
        """Every entry by name (built-ins first, then plugins, in load order)."""
        self._load()
        return dict(self.registered)

    def names(self) -> tuple[str, ...]:
        return tuple(self.entries())

    def load_errors(self) -> list[tuple[str, str]]:
        """Plugins that failed to import: ``(entry point, error)``."""
        self._load()
        return list(self._load_errors)

    def get(self, name: Any) -> T | None:
        """The entry registered as ``name`` (a string, or an Enum by its name), or None."""
        return self.entries().get(str(getattr(name, "name", name)))

    def nearest(self, name: str) -> str | None:
        """The registered name closest to ``name`` (same letters in another case first)."""
        names = self.names()
        folded = [n for n in names if n.lower() == name.lower()]
        close = folded or difflib.get_close_matches(name, names, n=1, cutoff=0.5)
        return close[0] if close else None
