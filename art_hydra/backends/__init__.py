"""Model backends: load (or build) the model and tokenizer a run trains.

``torch`` uses transformers + peft and runs anywhere; ``unsloth`` uses Unsloth's
kernels on a CUDA GPU. Each backend is imported only when selected, and nothing
outside ``unsloth_backend`` imports unsloth.
"""

from __future__ import annotations

from typing import Any

from art_hydra.config.schema import BackendName


def prepare(backend_cfg: Any) -> None:
    """Import what the backend must import first (Unsloth patches transformers, and its
    patches apply only when it comes before transformers in the process)."""
    if backend_cfg.name == BackendName.unsloth:
        import unsloth  # noqa: F401


def load_model(model_cfg: Any, backend_cfg: Any, seed: int, charset: str | None = None) -> Any:
    """The :class:`~art_hydra.backends.torch_backend.LoadedModel` for ``cfg.model``.

    ``charset`` is the tiny model's vocabulary (the task's characters); pretrained
    models bring their own tokenizer.
    """
    if backend_cfg.name == BackendName.unsloth:
        from art_hydra.backends.unsloth_backend import load

        return load(model_cfg, backend_cfg, seed, charset)
    from art_hydra.backends.torch_backend import load

    return load(model_cfg, backend_cfg, seed, charset)
