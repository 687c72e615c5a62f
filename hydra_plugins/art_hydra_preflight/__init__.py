"""Hydra plugin package of art_hydra: the pre-flight sweeper.

Hydra imports every module under the ``hydra_plugins`` namespace at start-up, so this
package stays light: hydra, omegaconf and art_hydra's config layer only.
"""
