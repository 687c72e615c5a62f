"""The commands a user types: art-hydra (cli), its launch, export, generate."""
