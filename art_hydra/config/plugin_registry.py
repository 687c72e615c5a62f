"""What the registries users extend share: named entries added by art_hydra's own
modules and by installed plugins, loaded once, on first use, and a plugin that fails to
import reported as a problem, not a traceback and not silently left out.

Validators, world checks, policy losses, backends and advantage estimators each keep
their own entry type and registering decorator; this holds the part that is the same for
all five, so another registry is its entry type and one ``PluginRegistry(...)`` line.
Torch-free: the compose/validate path reads these registries.
"""

from __future__ import annotations

import difflib
import importlib
import os
import re
from collections.abc import Callable, Iterator
from importlib.metadata import EntryPoint, distributions
from typing import Any, Generic, TypeVar

from art_hydra.config.problems import Kind, Problem, fix
from art_hydra.import_path import installed_locations

T = TypeVar("T")

#: Every plugin entry point loaded in this process, as ``(group, name, value)``: code
#: outside art_hydra that ran, for the dry run's account.
LOADED: list[tuple[str, str, str]] = []


def installed_entry_points(group: str) -> Iterator[EntryPoint]:
    """The entry points of ``group`` that installed distributions declare: read from the
    environment's install folders only, never from the working folder, where a
    ``*.dist-info`` (hidden or not) lying among the data is data, not an install. The
    first distribution of a name wins, as ``importlib.metadata.entry_points`` has it."""
    yield from _entry_points_by_group().get(group, ())


#: Every group's entry points, read once per state of the install folders (their paths
#: and modification times: installing a package changes its folder's).
_SCANNED: dict[tuple, dict[str, list[EntryPoint]]] = {}


def _entry_points_by_group() -> dict[str, list[EntryPoint]]:
    """One pass over the installed distributions for all groups. A distribution's name
    comes from its folder (``_normalized_name``, as ``importlib.metadata`` dedupes),
    not its METADATA file, which costs an email parse per distribution (775 here)."""
    locations = installed_locations()
    key = tuple((path, _mtime(path)) for path in locations)
    if key not in _SCANNED:
        groups: dict[str, list[EntryPoint]] = {}
        seen: set[str] = set()
        for dist in distributions(path=locations):
            try:
                name = getattr(dist, "_normalized_name", None) or dist.metadata["Name"] or ""
                name = re.sub(r"[-_.]+", "-", name).lower()
                if name in seen:
                    continue
                seen.add(name)
                found = list(dist.entry_points)
            except Exception:  # an unreadable record: not an install to take code from
                continue
            for ep in found:
                groups.setdefault(ep.group, []).append(ep)
        _SCANNED.clear()
        _SCANNED[key] = groups
    return _SCANNED[key]


def _mtime(path: str) -> float:
    try:
        return os.stat(path).st_mtime
    except OSError:
        return -1.0


class PluginRegistry(Generic[T]):
    """Entries by name. Loading imports ``builtin_modules`` (first, in order), then every
    entry point of ``group`` an installed distribution declares; an entry point that
    fails to import is kept as a load error, which validation reports, instead of a
    traceback.

    ``what`` names one entry in reports ("policy loss"). ``adopt`` is called with each
    loaded entry point and the object it names, for a registry that takes an entry point
    naming a plain function it registers itself (validators)."""

    def __init__(
        self,
        group: str,
        builtin_modules: tuple[str, ...],
        what: str,
        adopt: Callable[[EntryPoint, Any], None] | None = None,
    ) -> None:
        self.group = group
        self.builtin_modules = builtin_modules
        self.what = what
        self.adopt = adopt
        #: What has registered so far, without loading (``register_*`` reads it: loading
        #: from inside a registration would import the registering module again).
        self.registered: dict[str, T] = {}
        self._loaded = False
        #: Entry points that failed to import, each with its error (type and message).
        self._load_errors: list[tuple[EntryPoint, str]] = []

    def _load(self) -> None:
        if self._loaded:
            return
        self._loaded = True
        for module in self.builtin_modules:
            importlib.import_module(module)
        for ep in installed_entry_points(self.group):
            LOADED.append((self.group, ep.name, ep.value))
            try:
                loaded = ep.load()
            except Exception as exc:  # reported by validation, not a traceback
                self._load_errors.append((ep, f"{type(exc).__name__}: {exc}"))
                continue
            if self.adopt is not None:
                self.adopt(ep, loaded)

    def entries(self) -> dict[str, T]:
        """Every entry by name (built-ins first, then plugins, in load order)."""
        self._load()
        return dict(self.registered)

    def names(self) -> tuple[str, ...]:
        return tuple(self.entries())

    def load_problems(self) -> list[Problem]:
        """Each plugin that failed to import, as a problem naming its entry point."""
        self._load()
        return [
            Problem(
                f"entry point {self.group}:{ep.name}",
                ep.value,
                f"the {self.what} plugin failed to import: {error}",
                fix(note=f"repair or uninstall the package that provides '{ep.value}'"),
                Kind.plugin,
            )
            for ep, error in self._load_errors
        ]

    def get(self, name: Any) -> T | None:
        """The entry registered as ``name`` (a string, or an Enum by its name), or None."""
        return self.entries().get(str(getattr(name, "name", name)))

    def nearest(self, name: str) -> str | None:
        """The registered name closest to ``name`` (same letters in another case first)."""
        names = self.names()
        folded = [n for n in names if n.lower() == name.lower()]
        close = folded or difflib.get_close_matches(name, names, n=1, cutoff=0.5)
        return close[0] if close else None
