"""The run folder and its records: lock, manifest, identity, checkpoints, interrupts,
progress, messages."""
