"""Registration of the schema and the pre-flight sweeper with Hydra.

``conf/config.yaml`` starts its defaults list with ``art_hydra_schema``, so every
composed config is typed by :class:`~art_hydra.config.schema.RunConfig` and a wrong
type in any YAML file or override fails at composition; it also selects
``hydra/sweeper=preflight``. ``conf/__init__.py`` calls :func:`register_configs`, and
Hydra imports that package whenever it loads ``pkg://art_hydra.conf``, so both are in
place for any Hydra entry point, launcher workers included. The sweeper class is also
registered with Hydra's plugin registry directly, because Hydra's plugin scan does not
see namespace packages installed in editable mode.
"""

from __future__ import annotations

from hydra.core.config_store import ConfigStore

from art_hydra.config.schema import RunConfig

#: Name of the schema node that ``conf/config.yaml`` puts first in its defaults list.
SCHEMA_NAME = "art_hydra_schema"

_registered = False


def register_configs() -> None:
    """Store the schema once per process; later calls are free."""
    global _registered
    if _registered:
        return
    _registered = True
    from hydra.core.plugins import Plugins

    # Hydra's plugin scan re-executes plugin modules (BasicSweeper among them), so the
    # scan must run before our sweeper module binds its base class.
    plugins = Plugins.instance()
    from hydra_plugins.art_hydra_preflight.preflight_sweeper import (
        PreflightSweeper,
        PreflightSweeperConf,
    )

    store = ConfigStore.instance()
    store.store(name=SCHEMA_NAME, node=RunConfig, provider="art_hydra")
    store.store(
        group="hydra/sweeper", name="preflight", node=PreflightSweeperConf, provider="art_hydra"
    )
    plugins.register(PreflightSweeper)
