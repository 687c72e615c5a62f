"""Sweeps: every point checked before its job starts, and what a sweep leaves behind.

:mod:`~art_hydra.sweeps.preflight` checks many points fast; :mod:`~art_hydra.sweeps.grid`
(the pre-flight sweeper's work) and :mod:`~art_hydra.sweeps.launching` (the pre-flight
launcher's, for sweepers that draw points as they go, with
:mod:`~art_hydra.sweeps.search_space`) refuse what cannot run, telling it through
:mod:`~art_hydra.sweeps.reports`; :mod:`~art_hydra.sweeps.summary` ranks the jobs. The
Hydra plugin classes themselves stay in ``hydra_plugins`` and are reached through
:mod:`~art_hydra.sweeps.plugins`.
"""
