"""art_hydra's own backends, declared as a plugin declares one (:func:`register_backend`).

Each declaration says everything the rest of the package knows about its backend: the
load function (imported only when a run selects it), what it can do, what it needs
installed and its own world checks. Importing this module imports neither torch nor
Unsloth: it is on the compose/validate path (the registry loads it before the first
lookup).
"""

from __future__ import annotations

from art_hydra.config.backends import register_backend

register_backend(
    "torch",
    load="art_hydra.engine.backends.torch_backend:load",
    help="transformers + peft, any device",
)

register_backend(
    "unsloth",
    load="art_hydra.engine.backends.unsloth_backend:load",
    # Unsloth patches transformers, and its patches apply only when it comes first.
    prepare="unsloth",
    four_bit=True,
    # One patched model on one device: no data-parallel ranks, no second sampler thread.
    several_ranks=False,
    # Its patched kernels and 4-bit weights are not what FSDP2 shards.
    shards=False,
    overlap_rollouts=False,
    own_precision=True,
    devices=("cuda",),
    cpu_note=(
        "Unsloth runs its CPU fallback (plain transformers + peft behind its API), which "
        "suits testing, not speed."
    ),
    requires=("unsloth",),
    install='pip install "art-hydra[unsloth]"',
    title="Unsloth",
    help="Unsloth's fast kernels and 4-bit loading (bitsandbytes) on a CUDA GPU",
)
