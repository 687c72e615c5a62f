"""The rollout-engine registry: the names ``rollout.engine`` accepts and what each engine
can do.

An engine declares itself once, where its code lives, with
:func:`register_rollout_engine`: its name, the class the run builds (a
``"module:Class"`` string, imported only when a run selects the engine), what it can do
and what it needs installed, each by its field of :class:`RolloutEngineDecl`::

    register_rollout_engine(
        "sglang",
        build="my_package.sglang_rollout:SGLangRollout",
        requires=("sglang",),
        install='pip install "sglang[all]"',
        model_folder=True,
        help="SGLang's offline engine",
    )

The class is built as ``Class(loaded, run, world)`` (the loaded policy, the run's typed
config, this rank's place) and implements the interface of
:mod:`art_hydra.engine.rollout.base` (generate, sync_weights, sleep, wake, close).
Validation and the world pre-flight read the capabilities from here: a rule that refuses
"this engine cannot do X" reads the field, never the engine's name.

Engines come from three places, loaded once per process before the first lookup:
art_hydra's own (:data:`BUILTIN_MODULES`: ``torch`` and ``vllm``), installed packages
through the ``art_hydra.rollout_engines`` entry-point group, and any module a launcher
script imported before calling ``art_hydra.commands.cli.main()``.

On the compose/validate path: it imports nothing heavier than the standard library.
"""

from __future__ import annotations

import dataclasses
import importlib
import importlib.util
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

from art_hydra.config.plugin_registry import PluginRegistry

#: Entry-point group through which other packages contribute rollout engines.
ENTRY_POINT_GROUP = "art_hydra.rollout_engines"

#: art_hydra's own engine declarations, loaded as a plugin would be (torch-free).
BUILTIN_MODULES = ("art_hydra.engine.rollout.declared",)


@dataclass(frozen=True)
class RolloutEngineDecl:
    """One registered rollout engine: how the run builds it and what it can do."""

    #: The value ``rollout.engine`` selects it with.
    name: str
    #: ``"module:Class"`` (or the class): built as ``Class(loaded, run, world)``.
    build: str | Callable[..., Any]
    #: It samples from the policy object itself (no copy of the weights to keep in
    #: sync, no model folder needed): the built-in sampler.
    in_process_policy: bool = False
    #: It loads the model from its folder (or hub id) itself, so the model must be one.
    model_folder: bool = True
    #: It runs under several data-parallel ranks.
    several_ranks: bool = True
    #: It can sample while the trainer trains (``rl.overlap_rollouts``).
    overlap_rollouts: bool = True
    #: Backends it cannot run beside (``backend.name`` values), each with the reason.
    incompatible_backends: tuple[tuple[str, str], ...] = ()
    #: Modules that must be importable for it to run.
    requires: tuple[str, ...] = ()
    #: The command that installs them (quoted when one is missing).
    install: str = ""
    #: Its name in words ("vLLM"), for messages; default: ``rollout.engine=<name>``.
    title: str = ""
    #: One line for the key table and ``--help``.
    help: str = ""
    #: The module that declared it (set by :func:`register_rollout_engine`).
    module: str = ""

    @property
    def words(self) -> str:
        return self.title or f"rollout.engine={self.name}"

    @property
    def installed(self) -> bool:
        """Whether every module it requires can be imported here (without importing it)."""
        return all(importlib.util.find_spec(m) is not None for m in self.requires)

    def builder(self) -> Callable[..., Any]:
        """The engine class (importing its module now, when the run needs it)."""
        if callable(self.build):
            return self.build
        module, _, name = self.build.partition(":")
        return getattr(importlib.import_module(module), name)


REGISTRY: PluginRegistry[RolloutEngineDecl] = PluginRegistry(
    ENTRY_POINT_GROUP, BUILTIN_MODULES, "rollout engine"
)
_engines = REGISTRY.registered

#: What a declaration may say: every field but the two the registry fills in itself.
DECLARATION_FIELDS = tuple(
    f.name for f in dataclasses.fields(RolloutEngineDecl) if f.name not in ("name", "module")
)


def register_rollout_engine(name: str, **declared: Any) -> RolloutEngineDecl:
    """Register ``rollout.engine=name``, declared by the fields of
    :class:`RolloutEngineDecl` (``build=...``, ``several_ranks=...``, ...)."""
    unknown = sorted(set(declared) - set(DECLARATION_FIELDS))
    if unknown or "build" not in declared:
        raise TypeError(
            f"register_rollout_engine({name!r}) got unknown field(s) {', '.join(unknown)} "
            f"or no build=; an engine declares {', '.join(DECLARATION_FIELDS)}"
        )
    for key in ("requires", "incompatible_backends"):
        if key in declared:
            declared[key] = tuple(tuple(v) if isinstance(v, list) else v for v in declared[key])
    import sys

    module = str(sys._getframe(1).f_globals.get("__name__", ""))
    engine = RolloutEngineDecl(name=name, module=module, **declared)
    old = _engines.get(name)
    if old is not None and (old.module, old.build) != (module, engine.build):
        raise ValueError(
            f"rollout engine {name!r} is registered twice: by {old.module} and by {module}"
        )
    _engines[name] = engine
    return engine


def rollout_engines() -> dict[str, RolloutEngineDecl]:
    """Every registered engine by name (built-ins first, then plugins, in load order)."""
    return REGISTRY.entries()


def get_rollout_engine(name: Any) -> RolloutEngineDecl | None:
    """The engine registered as ``name``, or None."""
    return REGISTRY.get(name)
