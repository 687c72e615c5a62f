"""Hydra plugin package of art_hydra: the pre-flight sweeper and launcher.

Hydra imports every module under the ``hydra_plugins`` namespace at start-up, so this
package holds only the plugin classes it must discover, and they stay light (hydra,
omegaconf and art_hydra's config layer at import). Their work lives in
:mod:`art_hydra.sweeps`; the entry points register them through
:mod:`art_hydra.sweeps.plugins`.
"""

from typing import Any


def __getattr__(name: str) -> Any:
    """Names that left this module when the package got its rooms (:mod:`art_hydra.moved`)."""
    from art_hydra import moved

    return moved.old_attribute(__name__, name)
