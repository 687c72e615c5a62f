"""The backend registry: the names ``backend.name`` accepts and what each backend can do.

A backend declares itself once, where its code lives, with :func:`register_backend`:
its name, the function that loads the model (a ``"module:function"`` string, imported
only when a run selects the backend, or the function itself), what it can do (4-bit
loading, several ranks, overlapped rollouts, the devices it is for, whether it manages
its own precision), the modules it needs installed and its own world checks, each by
its field of :class:`Backend`::

    register_backend(
        "my_backend",
        load="my_package.backend:load",   # (model_cfg, backend_cfg, seed, charset) -> LoadedModel
        several_ranks=False,
        help="transformers with my kernels",
    )

or as a decorator on the load function (``@register_backend("my_backend", ...)``).
Validation, the world pre-flight, the key table (docs/config-keys.md) and the JSON Schema read the
choices and capabilities from here, so nothing elsewhere names a backend: a validator
that refuses "this backend cannot do X" reads the capability, and the run loads the
model through the declaration.

Backends come from three places, loaded once per process before the first lookup:
art_hydra's own (:data:`BUILTIN_MODULES`: ``torch`` and ``unsloth``), installed
packages through the ``art_hydra.backends`` entry-point group (a module whose import
registers some, as for validators and policy losses), and any module a launcher script
imported before calling ``art_hydra.commands.cli.main()``.

This module is on the compose/validate path: it imports nothing heavier than the
standard library, and a declaration imports neither torch nor the backend's library.
"""

from __future__ import annotations

import dataclasses
import importlib
import importlib.util
from collections.abc import Callable, Iterable
from dataclasses import dataclass
from typing import Any

from art_hydra.config.plugin_registry import PluginRegistry

#: Entry-point group through which other packages contribute backends.
ENTRY_POINT_GROUP = "art_hydra.backends"

#: art_hydra's own backend declarations, loaded as a plugin would be (torch-free).
BUILTIN_MODULES = ("art_hydra.engine.backends.declared",)

#: The devices a backend may declare (``backend.device`` besides ``auto``).
DEVICES = ("cpu", "cuda")

#: A backend's own world check: ``check(cfg, devices_here)`` -> problems (or None).
BackendCheck = Callable[[Any, bool], Iterable[Any] | None]


@dataclass(frozen=True)
class Backend:
    """One registered backend: how it loads a model and what it can do. Each field is
    declared here once (its default and its meaning); :func:`register_backend` takes them
    by these names."""

    #: The value ``backend.name`` selects it with.
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
    #: FSDP2 can shard what it loads over the ranks (``distributed.strategy=fsdp``).
    shards: bool = True
    #: It lets a second thread sample on a copy of the policy (``rl.overlap_rollouts``).
    overlap_rollouts: bool = True
    #: It manages its own precision: no float32 master weights, no float16 loss scaler.
    own_precision: bool = False
    #: The devices it is made for (of :data:`DEVICES`); without ``cpu``, a run that would
    #: land on the CPU is warned with ``cpu_note``.
    devices: tuple[str, ...] = DEVICES
    #: What happens when it runs on the CPU anyway (the warning's second sentence).
    cpu_note: str = ""
    #: Modules that must be importable for it to run.
    requires: tuple[str, ...] = ()
    #: The command that installs them (quoted when one is missing).
    install: str = ""
    #: Its name in words ("Unsloth"), for messages; default: ``backend=<name>``.
    title: str = ""
    #: Its own world checks, run by the world pre-flight when it is selected.
    checks: tuple[BackendCheck, ...] = ()
    #: One line for the key table and ``--help``; default: the first sentence of the
    #: load function's docstring.
    help: str = ""
    #: The module that declared it (set by :func:`register_backend`; art_hydra's own are
    #: the built-ins).
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


#: What a declaration may say: every field of :class:`Backend` but the two the registry
#: fills in itself (the name, given first, and the declaring module).
DECLARATION_FIELDS = tuple(
    f.name for f in dataclasses.fields(Backend) if f.name not in ("name", "module")
)

#: The fields a declaration may give as any iterable, kept as tuples (the entry is frozen).
_TUPLES = tuple(f.name for f in dataclasses.fields(Backend) if isinstance(f.default, tuple))


def register_backend(name: str, **declared: Any) -> Any:
    """Register the backend ``backend.name=name`` (see the module's docstring), declared
    by the fields of :class:`Backend` (``load=...``, ``several_ranks=...``, ...).

    With ``load`` given, it registers and returns the :class:`Backend`; without, it is a
    decorator that registers the decorated function as the load function."""
    unknown = sorted(set(declared) - set(DECLARATION_FIELDS))
    if unknown:
        raise TypeError(
            f"register_backend({name!r}) got unknown field(s) {', '.join(unknown)}; "
            f"a backend declares {', '.join(DECLARATION_FIELDS)}"
        )
    for key in _TUPLES:
        if key in declared:
            declared[key] = tuple(declared[key])
    devices = declared.get("devices", DEVICES)
    if not devices or any(d not in DEVICES for d in devices):
        raise ValueError(f"backend {name!r} declares devices {list(devices)}; of {DEVICES}")
    load = declared.pop("load", None)

    def declare(fn: str | Callable[..., Any], module: str) -> Backend:
        # A load named by its path has no docstring to read (not str's own).
        doc = " ".join(((fn.__doc__ if callable(fn) else None) or "").split()).partition(". ")[0]
        fields = {**declared, "help": declared.get("help") or doc}
        backend = Backend(name=name, load=fn, module=module, **fields)
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
