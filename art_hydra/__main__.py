"""``python -m art_hydra``: the same command as ``art-hydra``.

Guarded, so importing this module (a tool that walks the package's modules, a
documentation builder) starts no run.
"""

from art_hydra.commands.cli import main

if __name__ == "__main__":
    main()
