"""Hydra plugin package of art_hydra: the pre-flight sweeper.

Hydra imports every module under the ``hydra_plugins`` namespace at start-up, so this
package stays light: hydra, omegaconf and art_hydra's config layer only.
"""


def register_sweeper() -> None:
    """Register the sweeper class with Hydra's plugin registry.

    Hydra's own scan does not see namespace packages installed in editable mode. The
    scan also re-executes plugin modules (BasicSweeper among them), so it must run
    before the sweeper module binds its base class: ``Plugins.instance()`` first.
    """
    from hydra.core.plugins import Plugins

    plugins = Plugins.instance()
    from hydra_plugins.art_hydra_preflight.preflight_sweeper import PreflightSweeper

    plugins.register(PreflightSweeper)
