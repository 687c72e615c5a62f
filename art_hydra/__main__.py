"""``python -m art_hydra``: the same command as ``art-hydra``."""

from art_hydra.cli import main

main()
