"""transformers + peft backend: any causal LM, LoRA or full fine-tuning, CPU or CUDA."""

from __future__ import annotations

import contextlib
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Any

from hydra.errors import CompactHydraException

from art_hydra import moved
from art_hydra.config.schema import Device, DType, FinetuneMethod, ModelSource
from art_hydra.engine.backends.layout import row_layout
from art_hydra.engine.packing import Layout

if TYPE_CHECKING:
    from art_hydra.config.schema import BackendConfig, ModelConfig

log = moved.logger(__name__)  # the name it logged under before the move


@dataclass
class LoadedModel:
    """What a backend hands the run: the trainable model, its tokenizer and device."""

    #: The policy (peft's LoRA tuner over the model, or the plain model for full tuning).
    model: Any
    #: The tokenizer (left padding).
    tokenizer: Any
    #: Where the model lives.
    device: Any
    #: True when the model carries LoRA adapters (the reference policy is then the base).
    is_peft: bool
    #: How training rows are laid out and prompts batched, chosen by the backend from the
    #: model's config (see :func:`art_hydra.engine.backends.layout.row_layout`).
    layout: Layout
    #: Mixed precision: every forward (training, sampling, old and reference logprobs)
    #: runs under autocast to this half dtype over float32 trained weights, with loss
    #: scaling for float16 (None: compute in the weights' own dtype).
    autocast: Any = None
    #: Full fine-tuning of pure bfloat16 weights, without float32 masters
    #: (``model.master_weights=false``): small updates round away (the trainer measures
    #: how many at its learning rate and warns).
    half_weights: bool = False
    #: The sharding (:class:`art_hydra.engine.sharding.Sharding`) once the trainer has
    #: sharded the model over the ranks (distributed.strategy=fsdp), else None.
    sharding: Any = None

    def compute_precision(self) -> contextlib.AbstractContextManager[Any]:
        """The one precision this model computes in, for training and sampling alike:
        autocast to :attr:`autocast`, or nothing. Sampling in another precision than the
        training forward would make the on-policy importance ratio differ from 1."""
        if self.autocast is None:
            return contextlib.nullcontext()
        import torch

        return torch.autocast(self.device.type, dtype=self.autocast)

    def frozen_copy(self) -> Any:
        """A copy of the policy that is never trained (the reference, the overlapped
        sampler), for forwards in :meth:`compute_precision`: under mixed precision its
        linear weights are stored in the half type (see :func:`frozen_copy`)."""
        if self.sharding is not None:  # a whole copy, gathered from the shards
            from art_hydra.engine.sharding import whole_copy

            return whole_copy(
                self.sharding, self.model, self.device, lambda twin: halve(twin, self.autocast)
            )
        return frozen_copy(self.model, self.autocast)

    def save_weights(self, folder: Path, whole: dict[str, Any] | None = None) -> None:
        """The trained weights as a standard folder (PEFT adapters, or a full model), and
        the tokenizer, all safetensors. ``whole``: the state gathered from the shards
        (:meth:`gather_weights`), written as a single process writes its own."""
        if self.is_peft:
            from art_hydra.engine.backends.adapters import save_adapters

            save_adapters(self.model, folder, whole)
        elif whole is not None:
            self.sharding.skeleton.save_pretrained(
                folder, state_dict=whole, safe_serialization=True
            )
        else:
            self.model.save_pretrained(folder, safe_serialization=True)
        self.tokenizer.save_pretrained(folder)

    def gather_weights(self, main: bool) -> dict[str, Any] | None:
        """The sharded weights whole on the ``main`` rank (a collective every rank joins;
        only what :meth:`save_weights` writes: the adapters of a LoRA run); None where
        nothing is sharded."""
        if self.sharding is None:
            return None
        from art_hydra.engine.sharding import gathered_state

        return gathered_state(self.model, main, trained_only=self.is_peft)

    def load_weights(self, folder: Path) -> None:
        """Load weights written by :meth:`save_weights` into this (same-shaped) model."""
        from safetensors.torch import load_file

        # Sharded, every rank reads the same files, a tensor at a time, into CPU memory,
        # each cut at once to this rank's shard (never the whole model on every device).
        device = "cpu" if self.sharding is not None else str(self.device)
        if self.is_peft:
            from art_hydra.engine.backends.adapters import load_adapters

            weights = load_file(folder / "adapter_model.safetensors", device=device)
            unexpected = load_adapters(self.model, weights)
            if unexpected:
                raise RuntimeError(f"{folder} does not match the adapters: {unexpected[:5]}")
            return
        weights = {}
        for shard in sorted(folder.glob("*.safetensors")):
            if self.sharding is not None:
                from art_hydra.engine.sharding import parameter_target, read_placed

                weights.update(read_placed(shard, parameter_target(self.model)))
            else:
                weights.update(load_file(shard, device=device))
        missing, unexpected = self.model.load_state_dict(weights, strict=False)
        if unexpected or [m for m in missing if not m.endswith("lm_head.weight")]:
            raise RuntimeError(
                f"{folder} does not match the model: missing {missing[:5]}, "
                f"unexpected {unexpected[:5]}"
            )


def resolve_device(device: Device) -> Any:
    import torch

    if device == Device.auto:
        return torch.device("cuda" if torch.cuda.is_available() else "cpu")
    if device == Device.cuda and not torch.cuda.is_available():
        raise RuntimeError(
            "backend.device=cuda but torch sees no CUDA GPU; use backend.device=auto or cpu"
        )
    return torch.device(device.value)


def torch_dtype(dtype: DType) -> Any:
    """The dtype ``dtype`` names for loading (float16 trains mixed, on float32 masters);
    :func:`load_dtype` is the torch backend's choice, which also keeps bfloat16 masters."""
    import torch

    return {
        DType.auto: "auto",
        DType.float32: torch.float32,
        DType.bfloat16: torch.bfloat16,
        DType.float16: torch.float32,
    }[dtype]


def _full(model_cfg: ModelConfig) -> bool:
    return model_cfg.finetune == FinetuneMethod.full


def load_dtype(model_cfg: ModelConfig) -> Any:
    """The dtype the torch backend loads weights in: float32 where they train on float32
    masters (full fine-tuning under float16, and under bfloat16 unless
    ``model.master_weights=false``), loaded straight in float32 rather than cast after;
    a LoRA base in the half type, float16 included (it is frozen, so it needs no masters,
    and float32 would cost twice the memory for the same autocast compute); ``auto`` the
    checkpoint's."""
    import torch

    if not _full(model_cfg) and autocast_dtype(model_cfg.dtype) is not None:
        return autocast_dtype(model_cfg.dtype)
    if model_cfg.dtype == DType.bfloat16 and model_cfg.master_weights:
        return torch.float32
    return torch_dtype(model_cfg.dtype)


def autocast_dtype(dtype: DType) -> Any:
    """The autocast dtype ``dtype`` names (its half type), or None for float32/auto."""
    import torch

    return {DType.float16: torch.float16, DType.bfloat16: torch.bfloat16}.get(dtype)


class HalfWeightsError(CompactHydraException, ValueError):
    """float16 weights were asked to train without float32 masters."""


def settle_precision(model: Any, model_cfg: ModelConfig) -> tuple[Any, bool]:
    """Put the loaded ``model``'s weights in the dtype they train in, and return the
    autocast dtype every forward uses and whether pure half weights train.

    The half type is ``model.dtype``'s, or with ``auto`` the checkpoint's. Full
    fine-tuning trains float32 masters under autocast to it (a half checkpoint loaded with
    ``auto`` is cast up here), unless ``model.master_weights=false`` asks for pure
    bfloat16 weights; float16 weights cannot train (refused). A LoRA base stays frozen
    in the half type and computes under autocast; its trained weights (adapters and
    ``modules_to_save``) are cast to float32 by :func:`float32_trainables`.
    """
    import torch

    half = autocast_dtype(model_cfg.dtype)
    if model_cfg.dtype == DType.auto:
        loaded = next(model.parameters()).dtype
        half = loaded if loaded in (torch.float16, torch.bfloat16) else None
    if half is None or not _full(model_cfg):
        return half, False
    if model_cfg.master_weights:
        model.float()  # loaded in float32 already unless dtype=auto found a half checkpoint
        return half, False
    if half == torch.float16:
        raise HalfWeightsError(
            f"model.master_weights=false with model.dtype={model_cfg.dtype.name}: the "
            f"checkpoint {model_cfg.name} is float16, and float16 weights cannot train "
            "(they overflow within a few steps, and loss scaling needs float32 weights). "
            "Fix: model.master_weights=true (float16 mixed precision), or model.dtype=bfloat16."
        )
    return None, True  # pure bfloat16 weights compute in their own dtype


def autocast_linears(model: Any) -> list[Any]:
    """The plain ``nn.Linear`` modules of ``model`` (autocast casts their weight and
    bias to the half type on every call) whose parameters no other module shares: a head
    tied to the input embeddings is left out, since the embedding lookup reads its
    weight in its own dtype."""
    import torch

    shared: set[int] = set()
    linears = []
    for module in model.modules():
        plain = type(module).forward is torch.nn.Linear.forward
        if isinstance(module, torch.nn.Linear) and plain:
            linears.append(module)
        else:
            shared.update(id(p) for p in module.parameters(recurse=False))
    return [m for m in linears if not any(id(p) in shared for p in m.parameters())]


def frozen_copy(model: Any, half: Any) -> Any:
    """A copy of ``model`` that is never trained (the reference policy, the overlapped
    sampler), in evaluation mode and without gradients, for forwards under autocast to
    ``half`` (None: the weights' own dtype, copied as they are).

    The float32 weights of its linear layers are stored in ``half``: autocast rounds
    them to it on every call anyway, so the copy computes the same bits as ``model``
    under the same autocast, at 2 bytes per such weight instead of 4. Embeddings, norms
    and anything else autocast leaves in float32 stay float32 (halving them would round
    the residual stream the policy's forward keeps in float32). The half weights are
    made one at a time, so no full float32 copy is ever held."""
    import copy

    import torch

    memo: dict[int, Any] = {}
    if half is not None:
        for module in autocast_linears(model):
            for param in module.parameters(recurse=False):
                if param.dtype == torch.float32:
                    memo[id(param)] = torch.nn.Parameter(
                        param.detach().to(half), requires_grad=False
                    )
    twin = copy.deepcopy(model, memo)
    return twin.eval().requires_grad_(False)


def halve(model: Any, half: Any) -> None:
    """Re-type, in place, the float32 weights of ``model``'s autocast linears to ``half``
    (None: nothing), as :func:`frozen_copy` stores them; for a copy still on the meta
    device, whose tensors are then made in that type."""
    import torch

    if half is None:
        return
    for module in autocast_linears(model):
        for name, param in list(module.named_parameters(recurse=False)):
            if param.dtype == torch.float32:
                module._parameters[name] = torch.nn.Parameter(
                    param.detach().to(half), requires_grad=False
                )


def float32_trainables(model: Any) -> None:
    """Cast every trained parameter of a LoRA model (adapters, ``modules_to_save``) to
    float32, whatever the frozen base's dtype: half adapters would round their own small
    updates away, as pure half weights do."""
    import torch

    for param in model.parameters():
        if param.requires_grad and param.dtype != torch.float32:
            param.data = param.data.float()


#: Below this share of trainable weights that a step of the learning rate cannot move,
#: pure bfloat16 weights are let pass silently.
ROUNDED_AWAY_WARN = 0.01


def rounded_away_share(model: Any, learning_rate: float) -> float:
    """The share of trainable weights ``w`` that an update of about the learning rate (an
    Adam step is about ``lr`` per weight) leaves unchanged in bfloat16: those where
    ``w + lr`` rounds back to ``w`` (``lr`` below half the gap to the next bfloat16 value
    away from zero, which is between ``|w| * 2**-9`` and ``|w| * 2**-8``), tested on the
    values themselves rather than bounded."""
    import torch

    stuck = total = 0
    with torch.no_grad():
        for param in model.parameters():
            if param.requires_grad:
                magnitude = param.detach().abs().to(torch.bfloat16)
                moved = (magnitude.float() + learning_rate).to(torch.bfloat16)
                stuck += int((moved == magnitude).sum())
                total += param.numel()
    return stuck / total if total else 0.0


def warn_if_updates_round_away(model: Any, learning_rate: float) -> float:
    """Measure :func:`rounded_away_share` for pure bfloat16 weights and warn, with the
    share and the fix, when more than :data:`ROUNDED_AWAY_WARN` of them would not move."""
    share = rounded_away_share(model, learning_rate)
    if share > ROUNDED_AWAY_WARN:
        log.warning(
            "model.master_weights=false trains pure bfloat16 weights: at "
            "trainer.learning_rate=%g an update is below half a bfloat16 step for %.1f%% of "
            "the trainable weights, so most of each update rounds away. Fix: "
            "model.master_weights=true (float32 master weights, bfloat16 compute).",
            learning_rate,
            100.0 * share,
        )
    return share


def load_base(model_cfg: ModelConfig, seed: int, charset: str | None = None) -> tuple[Any, Any]:
    """The base model and tokenizer, before any adapter."""
    if model_cfg.source == ModelSource.tiny:
        from art_hydra.engine.backends.tiny import build_model, build_tokenizer

        tokenizer = build_tokenizer(charset)
        model = build_model(model_cfg, tokenizer, seed)
        if model_cfg.dtype != DType.auto:
            model = model.to(load_dtype(model_cfg))
        return model, tokenizer
    from transformers import AutoModelForCausalLM, AutoTokenizer

    tokenizer = AutoTokenizer.from_pretrained(
        model_cfg.name, revision=model_cfg.revision, trust_remote_code=model_cfg.trust_remote_code
    )
    tokenizer.padding_side = "left"
    model, info = AutoModelForCausalLM.from_pretrained(
        model_cfg.name,
        revision=model_cfg.revision,
        trust_remote_code=model_cfg.trust_remote_code,
        dtype=load_dtype(model_cfg),
        use_safetensors=True,  # never unpickle weights (a pickle can run any code)
        output_loading_info=True,
    )
    _refuse_missing_weights(model, info, str(model_cfg.name))
    settle_special_tokens(tokenizer, model, str(model_cfg.name))
    return model, tokenizer


class MissingWeightsError(CompactHydraException, ValueError):
    """The checkpoint lacks weights the architecture needs: transformers would start them
    at random and the run would fine-tune a partly random model without a word."""


def _refuse_missing_weights(model: Any, info: dict[str, Any], name: str) -> None:
    """Refuse a load that left weights at their random start (a truncated re-save, a
    shard from another revision). A head tied to the embeddings is not missing."""
    tied = set()
    if getattr(model.config, "tie_word_embeddings", False):
        tied = {n for n, _ in model.named_parameters() if n.endswith("lm_head.weight")}
    missing = sorted(set(info.get("missing_keys") or ()) - tied)
    if missing:
        shown = ", ".join(missing[:5]) + (
            f" and {len(missing) - 5} more" if len(missing) > 5 else ""
        )
        raise MissingWeightsError(
            f"model.name={name}: the checkpoint has no weights for {len(missing)} tensor(s) "
            f"the architecture needs ({shown}); transformers would start them at random and "
            "the run would train a partly random model. Fix: point model.name at the complete "
            "folder save_pretrained wrote (or download it again: hf download <id>)."
        )


class MissingTokenError(CompactHydraException, ValueError):
    """The tokenizer has no EOS and none can be derived: completions could never end."""


def _first_id(value: Any) -> int | None:
    if isinstance(value, (list, tuple)) and value:
        value = value[0]
    return value if isinstance(value, int) and not isinstance(value, bool) else None


def settle_special_tokens(tokenizer: Any, model: Any, name: str) -> None:
    """EOS and pad as the pre-flight derived them (:func:`art_hydra.folder_tokenizer.
    eos_token`): the tokenizer's own EOS, else the first ``eos_token_id`` of the
    generation config, then of the model config; pad is the tokenizer's, else EOS."""
    if tokenizer.eos_token is None:
        generation = getattr(model, "generation_config", None)
        config = getattr(model, "config", None)
        text = getattr(config, "get_text_config", lambda: config)()
        for source in (generation, config, text):
            token_id = _first_id(getattr(source, "eos_token_id", None))
            token = None if token_id is None else tokenizer.convert_ids_to_tokens(token_id)
            if token is not None:
                tokenizer.eos_token = token
                log.info("tokenizer has no eos_token: EOS is %r (eos_token_id=%d)", token, token_id)
                break
    if tokenizer.eos_token is None:
        raise MissingTokenError(
            f"model.name={name}: its tokenizer has no EOS token and its configs name no "
            'eos_token_id, so a completion could never end. Add "eos_token" to its '
            "tokenizer_config.json."
        )
    if tokenizer.pad_token is None:
        tokenizer.pad_token = tokenizer.eos_token
        log.info("tokenizer has no pad token: padding with EOS %r", tokenizer.eos_token)


def load(
    model_cfg: ModelConfig, backend_cfg: BackendConfig, seed: int, charset: str | None = None
) -> LoadedModel:
    """Load ``cfg.model`` with transformers (+ peft) on ``cfg.backend.device``."""
    device = resolve_device(backend_cfg.device)
    model, tokenizer = load_base(model_cfg, seed, charset)
    autocast, half_weights = settle_precision(model, model_cfg)
    if backend_cfg.gradient_checkpointing:
        model.gradient_checkpointing_enable()
    layout = row_layout(model.config, capacity=model_cfg.max_seq_length)
    log.debug("row layout: %s", layout.reason)  # the run's start summary says it in full
    is_peft = model_cfg.finetune == FinetuneMethod.lora
    if is_peft:
        from art_hydra.engine.backends.adapters import add_lora

        model = add_lora(model, model_cfg.lora, seed)
        float32_trainables(model)
    model.to(device)
    return LoadedModel(
        model=model,
        tokenizer=tokenizer,
        device=device,
        is_peft=is_peft,
        layout=layout,
        autocast=autocast,
        half_weights=half_weights,
    )
