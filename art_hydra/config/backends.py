"""The backend registry: the names ``backend.name`` accepts and what each backend can do.

A backend declares itself once, where its code lives, with :func:`register_backend`:
its name, the function that loads the model (a ``"module:function"`` string, imported
only when a run selects the backend, or the function itself), what it can do (4-bit
loading, several ranks, overlapped rollouts, the devices it is for, whether it manages
its own precision), the modules it needs installed and its own world checks::

    register_backend(
        "my_backend",
        load="my_package.backend:load",   # (model_cfg, backend_cfg, seed, charset) -> LoadedModel
        several_ranks=False,
        help="transformers with my kernels",
    )

or as a decorator on the load function (``@register_backend("my_backend", ...)``).
Validation, the world pre-flight, the README's key table and the JSON Schema read the
choices and capabilities from here, so nothing elsewhere names a backend: a validator
that refuses "this backend cannot do X" reads the capability, and the run loads the
model through the declaration.

Backends come from three places, loaded once per process before the first lookup:
art_hydra's own (:data:`BUILTIN_MODULES`: ``torch`` and ``unsloth``), installed
packages through the ``art_hydra.backends`` entry-point group (a module whose import
registers some, as for validators and policy losses), and any module a launcher script
imported before calling ``art_hydra.cli.main()``.

This module is on the compose/validate path: it imports nothing heavier than the
standard library, and a declaration imports neither torch nor the backend's library.
"""

from __future__ import annotations

import importlib
import importlib.util
from collections.abc import Callable, Iterable
from dataclasses import dataclass
from typing import Any

from art_hydra.config.plugin_registry import PluginRegistry

#: Entry-point group through which other packages contribute backends.
ENTRY_POINT_GROUP = "art_hydra.backends"

#: art_hydra's own backend declarations, loaded as a plugin would be (torch-free).
BUILTIN_MODULES = ("art_hydra.backends.declared",)

#: The devices a backend may declare (``backend.device`` besides ``auto``).
DEVICES = ("cpu", "cuda")

#: A backend's own world check: ``check(cfg, devices_here)`` -> problems (or None).
BackendCheck = Callable[[Any, bool], Iterable[Any] | None]


@dataclass(frozen=True)
class Backend:
    """One registered backend: how it loads a model and what it can do."""

    name: str
    #: ``load(model_cfg, backend_cfg, seed, charset)`` -> ``LoadedModel``, or its
    #: ``"module:function"`` path (imported when a run selects the backend).
    load: str | Callable[..., Any]
    #: A module imported before anything else touches transformers (Unsloth's patches).
    prepare: str | None = None
    #: It loads base weights quantised to 4 bits (``model.load_in_4bit``).
    four_bit: bool = False
    #: It trains with several ranks (torchrun, data-parallel).
    several_ranks: bool = True
    #: It lets a second thread sample on a copy of the policy (``rl.overlap_rollouts``).
    overlap_rollouts: bool = True
    #: It manages its own precision: no float32 master weights, no float16 loss scaler.
    own_precision: bool = False
    #: The devices it is made for (of :data:`DEVICES`); without ``cpu``, a run that would
    #: land on the CPU is warned (``cpu_note`` says what happens there).
    devices: tuple[str, ...] = DEVICES
    cpu_note: str = ""
    #: Modules that must be importable for it to run, and how to install them.
    requires: tuple[str, ...] = ()
    install: str = ""
    #: Its name in words ("Unsloth"), for messages; default: ``backend=<name>``.
    title: str = ""
    #: Its own world checks, run by the world pre-flight when it is selected.
    checks: tuple[BackendCheck, ...] = ()
    help: str = ""
    module: str = ""

    @property
    def builtin(self) -> bool:
        """Declared by art_hydra itself (chosen with the ``backend=`` config group)."""
        return self.module.startswith("art_hydra.")

    @property
    def words(self) -> str:
        """The backend in a sentence: "Unsloth", or "backend=my_backend"."""
        return self.title or f"backend={self.name}"

    @property
    def installed(self) -> bool:
        """Whether every module it requires can be imported here (without importing it)."""
        return all(importlib.util.find_spec(m) is not None for m in self.requires)

    def choose(self) -> dict[str, str]:
        """The override that selects it: its config group for art_hydra's own (which
        also sets the group's device and checkpointing), else ``backend.name``."""
        return {"backend": self.name} if self.builtin else {"backend.name": self.name}

    def override_to(self, other: Backend) -> dict[str, str]:
        """The override that moves a run on this backend to ``other``: the config group
        between art_hydra's own (it resets the group's device and checkpointing too),
        else ``backend.name`` (the key a plugin's backend was chosen with)."""
        return other.choose() if self.builtin else {"backend.name": other.name}

    def loader(self) -> Callable[..., Any]:
        """The load function (importing its module now, when the run needs it)."""
        if callable(self.load):
            return self.load
        module, _, function = self.load.partition(":")
        return getattr(importlib.import_module(module), function)


REGISTRY: PluginRegistry[Backend] = PluginRegistry(ENTRY_POINT_GROUP, BUILTIN_MODULES, "backend")
_backends = REGISTRY.registered


def register_backend(
    name: str,
    *,
    load: str | Callable[..., Any] | None = None,
    prepare: str | None = None,
    four_bit: bool = False,
    several_ranks: bool = True,
    overlap_rollouts: bool = True,
    own_precision: bool = False,
    devices: tuple[str, ...] = DEVICES,
    cpu_note: str = "",
    requires: tuple[str, ...] = (),
    install: str = "",
    title: str = "",
    checks: tuple[BackendCheck, ...] = (),
    help: str = "",
) -> Any:
    """Register the backend ``backend.name=name`` (see the module's docstring).

    With ``load`` given, it registers and returns the :class:`Backend`; without, it is a
    decorator that registers the decorated function as the load function."""
    unknown = [d for d in devices if d not in DEVICES]
    if unknown or not devices:
        raise ValueError(f"backend {name!r} declares devices {list(devices)}; of {DEVICES}")

    def declare(fn: str | Callable[..., Any], module: str) -> Backend:
        backend = Backend(
            name=name,
            load=fn,
            prepare=prepare,
            four_bit=four_bit,
            several_ranks=several_ranks,
            overlap_rollouts=overlap_rollouts,
            own_precision=own_precision,
            devices=tuple(devices),
            cpu_note=cpu_note,
            requires=tuple(requires),
            install=install,
            title=title,
            checks=tuple(checks),
            help=help or " ".join((getattr(fn, "__doc__", None) or "").split()).partition(". ")[0],
            module=module,
        )
        old = _backends.get(name)
        if old is not None and (old.module, _where(old.load)) != (module, _where(fn)):
            raise ValueError(
                f"backend {name!r} is registered twice: by {old.module} ({_where(old.load)}) "
                f"and by {module} ({_where(fn)})"
            )
        _backends[name] = backend
        return backend

    if load is not None:
        return declare(load, _caller_module())

    def decorate(fn: Callable[..., Any]) -> Callable[..., Any]:
        declare(fn, getattr(fn, "__module__", ""))
        return fn

    return decorate


def _where(load: str | Callable[..., Any]) -> str:
    if isinstance(load, str):
        return load
    return f"{getattr(load, '__module__', '')}:{getattr(load, '__qualname__', repr(load))}"


def _caller_module() -> str:
    """The module that called :func:`register_backend` (where the declaration lives)."""
    import sys

    frame = sys._getframe(2)
    return str(frame.f_globals.get("__name__", ""))


def backends() -> dict[str, Backend]:
    """Every registered backend by name (built-ins first, then plugins, in load order)."""
    return REGISTRY.entries()


def backend_names() -> tuple[str, ...]:
    """The names ``backend.name`` accepts."""
    return REGISTRY.names()


def get_backend(name: Any) -> Backend | None:
    """The backend registered as ``name`` (a string, or an Enum by its name), or None."""
    return REGISTRY.get(name)


def nearest_backend(name: str) -> str | None:
    """The registered name closest to ``name`` (same letters in another case first)."""
    return REGISTRY.nearest(name)
