"""Model backends: load (or build) the model and tokenizer a run trains.

Which backends exist, and what each can do, is the backend registry's
(:mod:`art_hydra.config.backends`; art_hydra's own are declared in
:mod:`art_hydra.engine.backends.declared`): ``torch`` uses transformers + peft and runs
anywhere; ``unsloth`` uses Unsloth's kernels on a CUDA GPU. A backend's module is
imported only when selected, and nothing outside ``unsloth_backend`` imports unsloth.
"""

from __future__ import annotations

import importlib
from typing import TYPE_CHECKING, Any

from art_hydra.config.backends import Backend, get_backend

if TYPE_CHECKING:
    from art_hydra.config.schema import BackendConfig, ModelConfig


def selected(backend_cfg: BackendConfig) -> Backend:
    """The registered backend ``backend.name`` names (validation has checked the name)."""
    backend = get_backend(backend_cfg.name)
    if backend is None:
        from art_hydra.config.backends import backend_names

        raise ValueError(
            f"backend.name={backend_cfg.name} is not a registered backend "
            f"({', '.join(backend_names())})"
        )
    return backend


def prepare(backend_cfg: BackendConfig) -> None:
    """Import what the backend must import first (Unsloth patches transformers, and its
    patches apply only when it comes before transformers in the process)."""
    module = selected(backend_cfg).prepare
    if module:
        importlib.import_module(module)


def load_model(
    model_cfg: ModelConfig, backend_cfg: BackendConfig, seed: int, charset: str | None = None
) -> Any:
    """The :class:`~art_hydra.engine.backends.torch_backend.LoadedModel` for ``cfg.model``.

    ``charset`` is the tiny model's vocabulary (the task's characters); pretrained
    models bring their own tokenizer.
    """
    from art_hydra.config.schema import ModelSource

    if model_cfg.chat_template and model_cfg.source == ModelSource.tiny:
        from art_hydra.engine.backends.tiny import CHARSET

        # A chat template writes its own characters (and tool results theirs).
        charset = "".join(dict.fromkeys(CHARSET + (charset or "")))
    loaded = selected(backend_cfg).loader()(model_cfg, backend_cfg, seed, charset)
    if model_cfg.chat_template:
        from art_hydra.templates import load_chat_template

        loaded.tokenizer.chat_template = load_chat_template(model_cfg.chat_template)
    return loaded
