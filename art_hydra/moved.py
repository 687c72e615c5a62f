"""The names modules had before the package was given its rooms (issue 33), kept working.

Code and entry points written against the flat layout (``art_hydra.cli:main``,
``from art_hydra.rl.losses import register_policy_loss``, ``art_hydra.backends``,
``python -m art_hydra.cli``) still import: the old name is the new module itself (one
object, so a registry filled through one name is the registry seen through the other),
with a ``DeprecationWarning`` naming the new home. A few functions and classes that moved
between modules answer under their old module too (:data:`OLD_ATTRIBUTES`). Loggers keep
the names they logged under (:func:`logger`): a user's logging config filters on them and
the console shows them. Dotted names that configs and old runs' ``run_config.yaml``
record (``art_hydra.tasks.rewards.*``, ``art_hydra.tasks.toy.*``) never moved.
"""

from __future__ import annotations

import importlib
import importlib.abc
import importlib.machinery
import importlib.util
import logging
import sys
import warnings
from types import CodeType, ModuleType
from typing import Any

#: Old module or package -> where it lives now; a submodule of an old package follows it.
OLD_NAMES: dict[str, str] = {
    "art_hydra.cli": "art_hydra.commands.cli",
    "art_hydra.launch": "art_hydra.commands.launch",
    "art_hydra.export": "art_hydra.commands.export",
    "art_hydra.generate": "art_hydra.commands.generate",
    "art_hydra.trained": "art_hydra.commands.trained",
    "art_hydra.producer": "art_hydra.engine.producer",
    "art_hydra.queue": "art_hydra.engine.queue",
    "art_hydra.trainer": "art_hydra.engine.trainer",
    "art_hydra.packing": "art_hydra.engine.packing",
    "art_hydra.recipe": "art_hydra.engine.recipe",
    "art_hydra.ranks": "art_hydra.engine.ranks",
    "art_hydra.distributed": "art_hydra.engine.distributed",
    "art_hydra.evaluation": "art_hydra.engine.evaluation",
    "art_hydra.result": "art_hydra.engine.result",
    "art_hydra.metrics": "art_hydra.engine.metrics",
    "art_hydra.cpu_load": "art_hydra.engine.cpu_load",
    "art_hydra.backends": "art_hydra.engine.backends",
    "art_hydra.rl": "art_hydra.engine.rl",
    "art_hydra.run_folder": "art_hydra.runs.run_folder",
    "art_hydra.run_identity": "art_hydra.runs.run_identity",
    "art_hydra.checkpoint": "art_hydra.runs.checkpoint",
    "art_hydra.interrupts": "art_hydra.runs.interrupts",
    "art_hydra.run_messages": "art_hydra.runs.run_messages",
    "art_hydra.progress": "art_hydra.runs.progress",
    "art_hydra.start_summary": "art_hydra.runs.start_summary",
    "art_hydra.sweep_preflight": "art_hydra.sweeps.preflight",
    "art_hydra.sweep_summary": "art_hydra.sweeps.summary",
    "art_hydra.config.registry": "art_hydra.config.validator_registry",
    "art_hydra.config.registries": "art_hydra.config.key_registries",
    "art_hydra.preflight.registry": "art_hydra.preflight.world_check_registry",
}


#: (module, name) -> "module:name" where it lives now, for names that left their module.
OLD_ATTRIBUTES: dict[tuple[str, str], str] = {
    ("art_hydra.engine.trainer", "Objective"): "art_hydra.engine.trainer:TrainingLoss",
    ("art_hydra.commands.export", "try_commands"): "art_hydra.runs.run_messages:try_commands",
    (
        "art_hydra.config.validators",
        "planned_launch",
    ): "art_hydra.config.launch_plan:planned_launch",
    ("art_hydra.config.validators", "torchrun_world_size"): (
        "art_hydra.config.launch_plan:torchrun_world_size"
    ),
    ("hydra_plugins.art_hydra_preflight", "register_sweeper"): (
        "art_hydra.sweeps.plugins:register_sweeper"
    ),
    ("hydra_plugins.art_hydra_preflight", "wrap_launchers"): (
        "art_hydra.sweeps.plugins:wrap_launchers"
    ),
}

#: Modules whose log lines came from a module of another name before the move.
_OLD_LOGGERS = {
    "art_hydra.sweeps.launching": "hydra_plugins.art_hydra_preflight.preflight_launcher",
    "art_hydra.sweeps.points": "hydra_plugins.art_hydra_preflight.preflight_launcher",
    "art_hydra.sweeps.search_space": "hydra_plugins.art_hydra_preflight.preflight_launcher",
    "art_hydra.sweeps.grid": "hydra_plugins.art_hydra_preflight.preflight_sweeper",
}


def new_name(name: str) -> str | None:
    """Where the module once called ``name`` lives now (None: it never moved)."""
    for old, new in OLD_NAMES.items():
        if name == old or name.startswith(old + "."):
            return new + name[len(old) :]
    return None


def old_attribute(module: str, name: str) -> Any:
    """The object ``module.name`` was before it moved (the module's ``__getattr__``)."""
    where = OLD_ATTRIBUTES.get((module, name))
    if where is None:
        raise AttributeError(f"module {module!r} has no attribute {name!r}")
    home, _, attr = where.partition(":")
    warnings.warn(
        f"{module}.{name} is now {home}.{attr}; the old name will go in a later release",
        DeprecationWarning,
        stacklevel=3,
    )
    return getattr(importlib.import_module(home), attr)


def logger(module: str) -> logging.Logger:
    """``module``'s logger under the name it logged under before the move."""
    if module in _OLD_LOGGERS:
        return logging.getLogger(_OLD_LOGGERS[module])
    for old, new in OLD_NAMES.items():
        if module == new or module.startswith(new + "."):
            return logging.getLogger(old + module[len(new) :])
    return logging.getLogger(module)


class _OldNames(importlib.abc.MetaPathFinder, importlib.abc.InspectLoader):
    """Answers an old name with the module under its new name."""

    def __init__(self) -> None:
        self._specs: dict[str, importlib.machinery.ModuleSpec | None] = {}

    def find_spec(
        self, fullname: str, path: object = None, target: object = None
    ) -> importlib.machinery.ModuleSpec | None:
        new = new_name(fullname)
        if new is None:
            return None
        real = importlib.util.find_spec(new)  # its file names the command (python -m)
        origin = real.origin if real is not None else None
        return importlib.machinery.ModuleSpec(fullname, self, origin=origin)

    def create_module(self, spec: importlib.machinery.ModuleSpec) -> ModuleType:
        new = self._warned(spec.name)
        module = importlib.import_module(new)
        # The import system sets __spec__ on what this returns: keep the module's own.
        self._specs[spec.name] = module.__spec__
        return module

    def exec_module(self, module: ModuleType) -> None:
        """The module ran under its new name already; its own spec goes back on it (the
        import system just set the old name's)."""
        alias = module.__spec__
        if alias is not None and alias.name in self._specs:
            module.__spec__ = self._specs.pop(alias.name)

    def get_code(self, fullname: str) -> CodeType | None:
        """``python -m <old name>`` runs the module's code under its new file."""
        new = self._warned(fullname)
        spec = importlib.util.find_spec(new)
        loader = spec.loader if spec is not None else None
        return loader.get_code(new) if isinstance(loader, importlib.abc.InspectLoader) else None

    def get_source(self, fullname: str) -> str | None:
        return None

    def _warned(self, name: str) -> str:
        new = new_name(name)
        assert new is not None
        warnings.warn(
            f"{name} is now {new}; the old name will go in a later release",
            DeprecationWarning,
            stacklevel=3,
        )
        return new


def install() -> None:
    """Put the old names first on the import path (once), so that ``art_hydra.rl.losses``
    is the module ``art_hydra.engine.rl.losses`` and never a second copy of it."""
    if not any(isinstance(f, _OldNames) for f in sys.meta_path):
        sys.meta_path.insert(0, _OldNames())


install()  # on import: art_hydra/__init__.py imports this module first
