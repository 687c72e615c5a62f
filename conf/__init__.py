"""art_hydra's shipped configs (installed as the package ``art_hydra.conf``).

Hydra imports this package whenever it loads ``pkg://art_hydra.conf``, which makes it
the one place that guarantees the schema and the pre-flight sweeper the configs name
are registered, whatever entry point composes them (launcher workers included).
"""

from art_hydra.config.store import register_configs
from art_hydra.sweeps.plugins import register_sweeper

register_configs()
register_sweeper()
