"""How the entry points reach art_hydra's Hydra plugins: the pre-flight sweeper and launcher.

The plugin classes live in the ``hydra_plugins`` namespace (Hydra discovers sweepers and
launchers only there), a layer above this package: they import art_hydra, never the
other way. So they are reached here by their dotted names, the way a config's
``_target_`` reaches the sweeper, and nothing in art_hydra imports the plugin layer.
"""

from __future__ import annotations

import importlib

from art_hydra.config.store import PreflightSweeperConf

#: The pre-flight sweeper, as configs (and old runs' ``.hydra`` records) name it.
SWEEPER = PreflightSweeperConf._target_
#: The launcher every sweeper's launcher is put behind.
LAUNCHER = "hydra_plugins.art_hydra_preflight.preflight_launcher.PreflightLauncher"


def register_sweeper() -> None:
    """Register the sweeper class with Hydra's plugin registry.

    Hydra's own scan does not see namespace packages installed in editable mode. The
    scan also re-executes plugin modules (BasicSweeper among them), so it must run
    before the sweeper module binds its base class: ``Plugins.instance()`` first.
    """
    from hydra.core.plugins import Plugins

    plugins = Plugins.instance()
    plugins.register(_plugin(SWEEPER))


def wrap_launchers() -> None:
    """Put every sweeper's launcher behind the pre-flight launcher, so points that any
    sweeper generates (Optuna's trials among them) are checked before their jobs start."""
    from art_hydra.config.hydra_compat import wrap_launchers as wrap

    wrap(_plugin(LAUNCHER))


def _plugin(dotted: str) -> type:
    module, _, name = dotted.rpartition(".")
    plugin: type = getattr(importlib.import_module(module), name)
    return plugin
