"""Hydra plugin package of art_hydra: the pre-flight sweeper and launcher.

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


def wrap_launchers() -> None:
    """Put every sweeper's launcher behind the pre-flight launcher, so points that any
    sweeper generates (Optuna's trials among them) are checked before their jobs start."""
    from art_hydra.config.hydra_compat import wrap_launchers as wrap
    from hydra_plugins.art_hydra_preflight.preflight_launcher import PreflightLauncher

    wrap(PreflightLauncher)
