"""The trainer: forward, loss, backward and one optimizer step per result.

It reads ``cfg.trainer`` (optimisation) and is handed a training loss (RL or SFT). Each
input is one optimizer step's work (:class:`art_hydra.engine.queue.StepWork`): its
``gradient_accumulation_steps`` micro-batches of packed rows are run forward and
backward, then it clips, steps the optimizer and scheduler, and returns one
:class:`StepResult`; nothing about a step outlives the call. A warmup pass runs forward
and backward only and returns a result without touching the weights or the optimizer's
moments.
"""

from __future__ import annotations

import contextlib
import re
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any

import torch

from art_hydra import moved
from art_hydra.engine.backends.torch_backend import LoadedModel, warn_if_updates_round_away
from art_hydra.engine.packing import PackedBatch
from art_hydra.engine.queue import StepWork
from art_hydra.engine.rl.logprobs import PolicyLogprobs
from art_hydra.engine.rl.losses import (
    PolicyLossSettings,
    importance_weight,
    policy_loss,
    sampling_mismatch,
    sft_loss,
)
from art_hydra.engine.rl.sampling import SamplingSettings
from art_hydra.engine.sharding import full

if TYPE_CHECKING:
    from art_hydra.config.schema import RLConfig, TrainerConfig

log = moved.logger(__name__)  # the name it logged under before the move


@dataclass
class StepResult:
    """What the trainer reports for one optimizer step (or the warmup pass)."""

    step: int
    loss: float
    grad_norm: float
    learning_rate: float
    kl: float
    entropy: float
    clip_fraction: float
    real_token_share: float
    trained_tokens: int
    warmup: bool = False
    info: dict[str, float] = field(default_factory=dict)
    #: Tokens the step's loss covered on this rank (weights its per-token statistics).
    loss_tokens: float = 0.0
    #: Further per-token statistics of the loss (token-weighted means over the step's
    #: micro-batches and ranks), and maxima (keys ending in ``_max``: the largest value
    #: over the step's micro-batches and ranks). Written to the metrics as they are.
    stats: dict[str, float] = field(default_factory=dict)


#: Statistics every loss reports; StepResult has a field for each.
CORE_STATS = ("kl", "entropy", "clip_fraction")


def is_max_stat(key: str) -> bool:
    """Whether a statistic combines by maximum (``..._max``) rather than token-weighted mean."""
    return key.endswith("_max")


class TrainingLoss:
    """RL or SFT loss for a packed micro-batch."""

    def __init__(self, sampling: SamplingSettings, rl: PolicyLossSettings | None) -> None:
        self.sampling = sampling
        self.rl = rl

    @classmethod
    def for_rl(cls, rl_cfg: RLConfig, sampling: SamplingSettings) -> TrainingLoss:
        """The RL loss; ``sampling`` must be the producer's, so logprobs match rollouts."""
        return cls(sampling, PolicyLossSettings.from_config(rl_cfg))

    @classmethod
    def for_sft(cls) -> TrainingLoss:
        return cls(SamplingSettings(), None)

    @property
    def needs_reference(self) -> bool:
        return self.rl is not None and self.rl.beta > 0


def packed_logprobs(
    model: Any, batch: PackedBatch, sampling: SamplingSettings
) -> tuple[torch.Tensor, torch.Tensor]:
    """Per-position logprob of the next token (and entropy) at the batch's trained
    positions (``loss_mask > 0``; 0 elsewhere), from one forward over its rows with the
    mask in the form its layout needs.

    ``model`` is a model, a :class:`PolicyLogprobs` around one, or DDP around that;
    logits are computed for trained positions only, a chunk at a time (see
    :mod:`art_hydra.engine.rl.logprobs`).
    """
    inner = getattr(model, "module", model)  # DDP wraps the PolicyLogprobs
    policy = model if isinstance(inner, PolicyLogprobs) else PolicyLogprobs(model)
    base = inner.model if isinstance(inner, PolicyLogprobs) else inner
    dtype = base.get_input_embeddings().weight.dtype  # what the attention scores are in
    return policy(
        batch.input_ids,
        batch.attention_mask(dtype),
        batch.position_ids,
        batch.loss_mask,
        batch.targets,
        sampling,
    )


#: Parameter names (lower-cased, dotted from the model) that weight decay spares:
#: Hugging Face's ``Trainer.get_decay_parameter_names`` (transformers 5.2x) word for word.
NO_DECAY_NAME_PATTERNS = (
    r"bias",
    r"layernorm",
    r"rmsnorm",
    r"(?:^|\.)norm(?:$|\.)",
    r"_norm(?:$|\.)",
)

#: The grouping :func:`build_optimizer` uses today, as checkpoints record it.
DECAY_RULE = "hf_names"
#: The grouping of checkpoints written before (no record): embeddings spared too.
LEGACY_DECAY_RULE = "embeddings_spared"


def no_decay_parameters(model: Any, rule: str = DECAY_RULE) -> set[int]:
    """Ids of the parameters that weight decay leaves alone.

    The rule is Hugging Face's Trainer's and TRL's (``get_decay_parameter_names``): a
    parameter is spared when its dotted name, lower-cased, contains ``bias``,
    ``layernorm`` or ``rmsnorm``, has a part named ``norm`` or ending in ``_norm``, or it
    belongs to a ``torch.nn.LayerNorm``; every other parameter decays, embeddings
    (``embed_tokens``) and a head tied to them included. A parameter reachable under two
    names (a tied head) is judged by its first name, as the Trainer's optimizer does.

    Decay pulls a weight towards zero; for a norm's gain (1 by design) or a bias that is a
    pull towards a meaningless value. ``rule=LEGACY_DECAY_RULE`` gives the grouping of
    checkpoints written before this rule (embeddings, norm classes and biases spared), so
    they resume with their own groups.
    """
    if rule == LEGACY_DECAY_RULE:
        return _legacy_no_decay_parameters(model)
    patterns = [re.compile(pattern) for pattern in NO_DECAY_NAME_PATTERNS]
    in_layer_norm = {
        id(p) for m in model.modules() if isinstance(m, torch.nn.LayerNorm) for p in m.parameters()
    }
    return {
        id(param)
        for name, param in model.named_parameters()
        if id(param) in in_layer_norm or any(p.search(name.lower()) for p in patterns)
    }


def _legacy_no_decay_parameters(model: Any) -> set[int]:
    """The grouping before :data:`DECAY_RULE`: biases, any module class with "Norm" in
    its name, and embeddings (with a head tied to them)."""
    keep: set[int] = set()
    for module in model.modules():
        whole = isinstance(module, torch.nn.Embedding) or "Norm" in type(module).__name__
        for name, param in module.named_parameters(recurse=False):
            if whole or name == "bias" or name.endswith("_bias"):
                keep.add(id(param))
    return keep


def scheduler_name(kind: str, warmup_steps: int) -> str:
    """The transformers schedule that honours ``warmup_steps`` for ``kind``: its
    ``constant`` ignores warmup, so a constant rate with warmup is
    ``constant_with_warmup`` (the same schedule once warmed up). Without warmup every
    name stays as it is, so runs (and their checkpoints) without it are unchanged."""
    if kind == "constant" and warmup_steps > 0:
        return "constant_with_warmup"
    return kind


def build_optimizer(
    model: Any, trainer_cfg: TrainerConfig, rule: str = DECAY_RULE
) -> tuple[Any, Any]:
    """AdamW over the trainable parameters, and the learning-rate schedule.

    With ``weight_decay > 0`` the parameters of :func:`no_decay_parameters` (under
    ``rule``) form a second group without decay. With no decay there is one group:
    splitting would change no update, and a checkpoint written before the split still
    loads.
    """
    from transformers import get_scheduler

    params = [p for p in model.parameters() if p.requires_grad]
    groups: list[dict[str, Any]] = [{"params": params}]
    if trainer_cfg.weight_decay > 0:
        keep = no_decay_parameters(model, rule)
        decayed = [p for p in params if id(p) not in keep]
        kept = [p for p in params if id(p) in keep]
        groups = [{"params": decayed}, {"params": kept, "weight_decay": 0.0}]
        groups = [group for group in groups if group["params"]]
    optimizer = torch.optim.AdamW(
        groups,
        lr=trainer_cfg.learning_rate,
        betas=(trainer_cfg.adam_beta1, trainer_cfg.adam_beta2),
        eps=trainer_cfg.adam_epsilon,
        weight_decay=trainer_cfg.weight_decay,
        # One kernel for all parameters instead of ~10 ops per tensor (4x faster on the
        # tiny model); torch has it for CPU and CUDA tensors.
        fused=all(p.device.type in ("cpu", "cuda") for p in params) or None,
    )
    scheduler = get_scheduler(
        scheduler_name(trainer_cfg.lr_scheduler_type.value, trainer_cfg.warmup_steps),
        optimizer,
        num_warmup_steps=trainer_cfg.warmup_steps,
        num_training_steps=trainer_cfg.max_steps,
    )
    return optimizer, scheduler


def schedule_rates(optimizer: Any, scheduler: Any) -> None:
    """Set each group's learning rate to what *this run's* schedule gives at the step
    the scheduler was restored to.

    A checkpoint holds the rate its own schedule reached (after the last step of a
    20-step linear run: 0.0). The schedule's shape is rebuilt from the config, so a run
    extended to more steps must not train its next step at the saved rate: it would
    take a step at lr 0 (Adam's moments advancing while nothing changes). With the same
    ``max_steps`` the rate computed is the one saved (the same expression on the same
    numbers), so an unchanged resume stays bitwise.
    """
    lambdas = getattr(scheduler, "lr_lambdas", None)
    if lambdas is None:  # every transformers schedule is a LambdaLR; others keep theirs
        return
    rates = [
        base * rate(scheduler.last_epoch)
        for rate, base in zip(lambdas, scheduler.base_lrs, strict=True)
    ]
    for group, rate in zip(optimizer.param_groups, rates, strict=True):
        group["lr"] = rate
    scheduler._last_lr = rates


def optimizer_to_safetensors(
    optimizer: Any, whole: dict[str, torch.Tensor] | None = None
) -> tuple[dict[str, torch.Tensor], dict[str, Any]]:
    """Split an optimizer state dict into tensors (safetensors) and plain values (JSON);
    ``whole``: the tensors already gathered from their shards, by the same names."""
    state = optimizer.state_dict()
    tensors: dict[str, torch.Tensor] = {}
    plain: dict[str, Any] = {"param_groups": state["param_groups"], "state": {}}
    for index, values in state["state"].items():
        plain["state"][str(index)] = {}
        for key, value in values.items():
            name = f"{index}.{key}"
            if whole is not None and name in whole:
                tensors[name] = whole[name]
            elif torch.is_tensor(value):
                tensors[name] = value.detach().contiguous().cpu()
            else:
                plain["state"][str(index)][key] = value
    return tensors, plain


#: The prefix of a re-anchored reference's tensors in a trainer's checkpoint state.
REFERENCE = "reference/"


def optimizer_from_safetensors(
    optimizer: Any, tensors: dict[str, torch.Tensor], plain: dict[str, Any]
) -> None:
    state: dict[int, dict[str, Any]] = {int(i): dict(v) for i, v in plain["state"].items()}
    for name, tensor in tensors.items():
        index, key = name.split(".", 1)
        state.setdefault(int(index), {})[key] = tensor
    optimizer.load_state_dict({"state": state, "param_groups": plain["param_groups"]})


def _no_buffer_sync() -> dict[str, bool]:
    """DDP's switch for not syncing buffers in every forward (renamed in recent torch)."""
    import inspect

    from torch.nn.parallel import DistributedDataParallel

    names = inspect.signature(DistributedDataParallel.__init__).parameters
    key = "forward_sync_buffers" if "forward_sync_buffers" in names else "broadcast_buffers"
    return {key: False}


def _sharded_policy(loaded: LoadedModel, policy: PolicyLogprobs, world: Any) -> Any:
    """The FSDP root that trains: the model sharded now, or already (the SFT warm start's
    trainer comes after the run's and shares its model)."""
    from art_hydra.engine.sharding import place_on_load, shard

    if loaded.sharding is None:
        loaded.sharding = shard(policy, loaded.model, world, world.fsdp, loaded.device)
        place_on_load(loaded.model)
    return loaded.sharding.root


def _loss_scaler(loaded: LoadedModel) -> Any:
    """Loss scaling for float16 mixed precision (its small range underflows gradients)."""
    if loaded.autocast != torch.float16:
        return None
    return torch.amp.GradScaler(loaded.device.type)


def _agree_on_overflow(scaler: Any, optimizer: Any) -> None:
    """Make every rank of a sharded run skip a step that overflowed on any rank: each
    rank's loss scaler checked only its shard of the gradients. (torch's
    ``ShardedGradScaler`` does the same all-reduce, but fails on DTensor gradients on the
    CPU in torch 2.13; the scaler's per-optimizer state is where both keep the flags.)"""
    import torch.distributed as dist

    state = scaler._per_optimizer_states[id(optimizer)]
    for found in state["found_inf_per_device"].values():
        dist.all_reduce(found, op=dist.ReduceOp.MAX)


def _optimizer_params(optimizer: Any) -> list[Any]:
    """The parameters in the order the optimizer's state dict numbers them."""
    return [p for group in optimizer.param_groups for p in group["params"]]


def _gathered_moments(optimizer: Any, main: bool) -> dict[str, torch.Tensor]:
    """The optimizer's sharded tensors, whole, on the ``main`` rank (a collective: every
    rank gathers each in the same order); named as :func:`optimizer_to_safetensors`
    names them."""
    from art_hydra.engine.sharding import full, is_sharded

    found: dict[str, torch.Tensor] = {}
    for index, param in enumerate(_optimizer_params(optimizer)):
        for key, value in sorted(optimizer.state.get(param, {}).items()):
            if torch.is_tensor(value) and is_sharded(value):
                whole = full(value.detach())
                if main:
                    found[f"{index}.{key}"] = whole.cpu().contiguous()
    return found


def _placed_moments(optimizer: Any, tensors: dict[str, torch.Tensor]) -> dict[str, Any]:
    """Whole moments read from a checkpoint, cut to this rank's shards of their
    parameters (a scalar like Adam's step count stays as it is)."""
    from art_hydra.engine.sharding import is_sharded, place_like

    params = _optimizer_params(optimizer)
    placed: dict[str, Any] = {}
    for name, tensor in tensors.items():
        param = params[int(name.split(".", 1)[0])]
        fits = is_sharded(param) and tuple(tensor.shape) == tuple(param.shape)
        fits = fits and not is_sharded(tensor)  # read_tensors cut it already
        placed[name] = place_like(tensor, param) if fits else tensor
    return placed


class _GatheredWeights:
    """The loaded model's stand-in for a checkpoint of a sharded run: writes the weights
    gathered on rank 0 as the model writes its own."""

    def __init__(self, loaded: LoadedModel, whole: dict[str, Any]) -> None:
        self.loaded, self.whole = loaded, whole

    def save_weights(self, folder: Any) -> None:
        self.loaded.save_weights(folder, self.whole)


class Trainer:
    """Owns the optimizer; :meth:`train_step` is what the queue's thread runs."""

    def __init__(
        self,
        loaded: LoadedModel,
        trainer_cfg: TrainerConfig,
        training_loss: TrainingLoss,
        world: Any = None,
    ) -> None:
        self.loaded = loaded
        self.model = loaded.model
        #: What trains: the model's logprobs at trained positions (PolicyLogprobs), or DDP
        #: around it when there are several ranks (the gradients are averaged across
        #: ranks in backward; buffers are not broadcast, since every rank builds the same
        #: ones).
        self.policy: Any = PolicyLogprobs(self.model)
        #: Sharded over the ranks (distributed.strategy=fsdp): the FSDP root trains.
        self.sharded = world is not None and world.shards
        self._ddp = world is not None and world.enabled and not self.sharded
        self.main = world is None or world.is_main
        if self.sharded:
            self.policy = _sharded_policy(loaded, self.policy, world)
        elif self._ddp:
            from torch.nn.parallel import DistributedDataParallel

            ids = [loaded.device.index] if loaded.device.type == "cuda" else None
            self.policy = DistributedDataParallel(self.policy, device_ids=ids, **_no_buffer_sync())
        self.cfg = trainer_cfg
        self.training_loss = training_loss
        #: Which parameters weight decay spares (checkpoints record it; see load_state_dict).
        self.decay_rule = DECAY_RULE
        self.optimizer, self.scheduler = build_optimizer(self.model, trainer_cfg)
        if loaded.half_weights:
            warn_if_updates_round_away(self.model, trainer_cfg.learning_rate)
        #: Loss scaling for float16 mixed precision (its small range underflows gradients).
        self.scaler = _loss_scaler(loaded)
        self.reference = self._build_reference() if training_loss.needs_reference else None
        #: Whether the reference was re-anchored (after the SFT warm start), so its
        #: weights are no longer the model folder's and go into checkpoints.
        self.reference_anchored = False
        self.step = 0
        #: The optimizer's moments gathered whole for the next checkpoint (sharded runs:
        #: :meth:`gather_checkpoint`), consumed by :meth:`state_dict`.
        self._whole_moments: dict[str, torch.Tensor] | None = None

    def gather_checkpoint(self) -> Any:
        """What a checkpoint writes the weights from, gathered on every rank at once
        where they are sharded (a collective; rank 0 keeps the whole tensors, and so do
        the optimizer's moments for :meth:`state_dict`): the loaded model itself, or a
        stand-in that writes the gathered weights as the model would."""
        whole = self.loaded.gather_weights(self.main)
        if whole is None:
            return self.loaded
        self._whole_moments = _gathered_moments(self.optimizer, self.main)
        return _GatheredWeights(self.loaded, whole)

    def state_dict(self) -> tuple[dict[str, torch.Tensor], dict[str, Any]]:
        """Optimizer moments (tensors, whole even when the run shards them); step,
        schedule and loss scaler (JSON-able)."""
        tensors, optimizer = optimizer_to_safetensors(self.optimizer, self._whole_moments)
        self._whole_moments = None
        plain = {
            "step": self.step,
            "optimizer": optimizer,
            "scheduler": self.scheduler.state_dict(),
            "scaler": self.scaler.state_dict() if self.scaler is not None else None,
            "decay_rule": self.decay_rule,
            "reference_anchored": self.reference_anchored,
        }
        if self.reference_anchored and self.reference is not None:
            # Re-anchored after the SFT warm start: a resume cannot rebuild it from the
            # model folder, so its weights travel with the checkpoint.
            for name, value in self.reference.state_dict().items():
                tensors[REFERENCE + name] = value.detach().clone().contiguous()
        return tensors, plain

    def read_tensors(self, path: Any) -> dict[str, Any]:
        """The checkpoint's tensors for :meth:`load_state_dict`: sharded, each moment is
        cut to this rank's shard as it is read (the file holds them whole)."""
        from safetensors.torch import load_file

        if not self.sharded:
            return load_file(path)
        from art_hydra.engine.sharding import read_placed

        params = _optimizer_params(self.optimizer)

        def target(name: str, shape: tuple[int, ...]) -> Any:
            index = name.split(".", 1)[0]
            if not index.isdigit() or int(index) >= len(params):
                return None  # the reference's tensors ("reference/...") stay whole
            param = params[int(index)]
            return param if tuple(param.shape) == shape else None

        return read_placed(path, target)

    def load_state_dict(self, tensors: dict[str, torch.Tensor], plain: dict[str, Any]) -> None:
        """Restore a checkpoint; one written under another weight-decay grouping (before
        :data:`DECAY_RULE`) resumes with its own groups, so each moment meets its
        parameter and the run goes on as it started."""
        reference = {k[len(REFERENCE) :]: v for k, v in tensors.items() if k.startswith(REFERENCE)}
        tensors = {k: v for k, v in tensors.items() if not k.startswith(REFERENCE)}
        if reference and self.reference is not None:
            self.reference.load_state_dict(reference)
            self.reference_anchored = True
        rule = plain.get("decay_rule", LEGACY_DECAY_RULE)
        if rule != self.decay_rule and self.cfg.weight_decay > 0:
            log.info(
                "the checkpoint grouped weight decay by its older rule (%s); the run keeps "
                "those groups",
                rule,
            )
            self.decay_rule = rule
            self.optimizer, self.scheduler = build_optimizer(self.model, self.cfg, rule)
        if self.sharded:  # whole moments in the file: each rank keeps its shard of them
            tensors = _placed_moments(self.optimizer, tensors)
        optimizer_from_safetensors(self.optimizer, tensors, plain["optimizer"])
        self.scheduler.load_state_dict(plain["scheduler"])
        schedule_rates(self.optimizer, self.scheduler)
        if self.scaler is not None and plain["scaler"]:
            self.scaler.load_state_dict(plain["scaler"])
        self.step = plain["step"]

    def anchor_reference(self) -> None:
        """Make the KL's reference the policy as it is now: after the SFT warm start, as
        TRL's SFT-then-RL pipeline anchors to the SFT model. A copy's weights are taken
        again; under LoRA the reference stays the base model with the adapters disabled
        (a composition warning says so)."""
        if self.reference is not None:
            self.reference = self._build_reference()
            self.reference_anchored = True

    def _build_reference(self) -> Any:
        """The frozen reference policy: the base model under the adapters, or a copy (its
        linear weights in the half type under mixed precision: the same logprobs as the
        policy's forward at the same weights, at half the bytes)."""
        if self.loaded.is_peft:
            return None  # computed with the adapters disabled
        return self.loaded.frozen_copy()

    def _reference_logprobs(self, batch: PackedBatch) -> torch.Tensor:
        with torch.no_grad():
            if self.loaded.is_peft:
                from art_hydra.engine.backends.adapters import adapters_disabled

                # Sharded, the forward goes through the FSDP root (which gathers).
                policy = self.policy if self.sharded else self.model
                with adapters_disabled(self.model):
                    return packed_logprobs(policy, batch, self.training_loss.sampling)[0]
            return packed_logprobs(self.reference, batch, self.training_loss.sampling)[0]

    def loss(self, batch: PackedBatch) -> tuple[torch.Tensor, dict[str, float]]:
        """The micro-batch's share of the step loss, and its statistics, computed in the
        model's one precision (the one its rollouts were sampled in)."""
        batch.to(self.loaded.device)
        with self.loaded.compute_precision():
            return self._loss(batch)

    def _loss(self, batch: PackedBatch) -> tuple[torch.Tensor, dict[str, float]]:
        logprobs, entropy = packed_logprobs(self.policy, batch, self.training_loss.sampling)
        mask = batch.loss_mask
        # Set where the step was made (packing.one_step); 0 only for a step with no
        # trained-on token, whose loss sum is 0 whatever divides it.
        denominator = batch.step_loss_tokens or 1.0
        if self.training_loss.rl is not None:
            ref = self._reference_logprobs(batch) if self.training_loss.needs_reference else None
            # On-policy, the policy that sampled is the one training: its old logprobs are
            # this forward's, detached (as TRL does), so the ratio is exactly 1; the
            # sampler's own only measure (and optionally correct) their difference.
            old = logprobs.detach() if batch.on_policy else batch.old_logprobs
            settings = self.training_loss.rl
            cap = settings.importance_sampling_cap
            sampler = batch.sampler_logprobs
            weight, weight_stats = None, {}
            if cap is not None and sampler is not None:
                mode = settings.importance_sampling_mode
                weight, weight_stats = importance_weight(
                    old, sampler, mask, batch.seq_ids, cap, mode
                )
            loss, stats = policy_loss(
                logprobs,
                old,
                batch.advantages,
                mask,
                self.training_loss.rl,
                denominator,
                ref,
                weight,
                batch.seq_ids,
                batch.completions,
            )
            stats.update(weight_stats)
            if sampler is not None:
                stats.update(sampling_mismatch(old, sampler, mask))
        else:
            loss, stats = sft_loss(logprobs, mask, denominator)
        masked = float(mask.sum().clamp(min=1))
        entropy = torch.where(mask > 0, entropy.detach(), torch.zeros_like(entropy))
        stats["entropy"] = float((entropy * mask).sum()) / masked
        stats["loss_tokens"] = float(mask.sum())
        return loss, stats

    def train_step(self, work: StepWork) -> StepResult:
        """One optimizer step's work (what the queue's thread runs): forward and backward
        over each of its micro-batches, then one clipped optimizer step; a warmup pass
        runs forward and backward on its first micro-batch only and changes nothing."""
        self.model.train()
        if work.warmup:
            batch = work.micro_batches[0]
            loss, stats = self._backward(batch, sync=True)
            self.optimizer.zero_grad(set_to_none=True)
            return self._result(loss.item(), 0.0, stats, batch, warmup=True)
        work.require(self.cfg.gradient_accumulation_steps, self.step + 1)
        sums: dict[str, float] = {}
        last = len(work.micro_batches) - 1
        for index, batch in enumerate(work.micro_batches):
            loss, stats = self._backward(batch, sync=index == last)
            _accumulate(sums, loss.item(), stats, batch)
        lr = self.scheduler.get_last_lr()[0]
        grad_norm, skipped = self._apply_gradients()
        return self._step_result(sums, grad_norm, lr, skipped, work.micro_batches[-1])

    def _backward(self, batch: PackedBatch, sync: bool) -> tuple[torch.Tensor, dict[str, float]]:
        """The micro-batch's loss, backpropagated. Across ranks, gradients are averaged
        once per optimizer step (``sync``: its last micro-batch), not after those that
        only accumulate."""
        if self.sharded:
            self.policy.set_requires_gradient_sync(sync)
        with self.policy.no_sync() if self._ddp and not sync else contextlib.nullcontext():
            loss, stats = self.loss(batch)
            (self.scaler.scale(loss) if self.scaler is not None else loss).backward()
        return loss, stats

    def _apply_gradients(self) -> tuple[float, bool]:
        """Clip, step the optimizer and the schedule, count the step: the gradient norm,
        and whether float16 loss scaling skipped the step."""
        max_norm = self.cfg.max_grad_norm if self.cfg.max_grad_norm > 0 else float("inf")
        params = [p for p in self.model.parameters() if p.requires_grad]
        if self.scaler is not None:
            self.scaler.unscale_(self.optimizer)  # clip the true gradient, not the scaled one
            if self.sharded:
                _agree_on_overflow(self.scaler, self.optimizer)
        # A sharded run's norm is over every rank's shards (a DTensor, reduced whole).
        grad_norm = float(full(torch.nn.utils.clip_grad_norm_(params, max_norm)))
        skipped = self._optimizer_step()
        if not skipped:
            self.scheduler.step()
        self.optimizer.zero_grad(set_to_none=True)
        self.step += 1
        if skipped:
            log.warning(
                "step %d: float16 loss scaling found an infinite or NaN gradient (grad_norm "
                "%s); the weights, the optimizer and the learning-rate schedule skipped the "
                "step, and the loss scale dropped to %g. Now and then this is how loss "
                "scaling finds its scale; at every step it means the run diverged.",
                self.step,
                grad_norm,
                self.scaler.get_scale() if self.scaler is not None else float("nan"),
            )
        return grad_norm, skipped

    def _step_result(
        self,
        sums: dict[str, float],
        grad_norm: float,
        lr: float,
        skipped: bool,
        last: PackedBatch,
    ) -> StepResult:
        """The step's result from its micro-batches' sums (:func:`_accumulate`)."""
        tokens = max(sums["loss_tokens"], 1.0)
        extra = _extra_stats(sums, tokens)
        if self.scaler is not None:
            extra["step_skipped"] = 1.0 if skipped else 0.0
        return StepResult(
            step=self.step,
            loss=sums["loss"],
            grad_norm=grad_norm,
            learning_rate=lr,
            kl=sums["kl"] / tokens,
            entropy=sums["entropy"] / tokens,
            clip_fraction=sums["clip_fraction"] / tokens,
            real_token_share=sums["tokens"] / sums["slots"],
            trained_tokens=int(sums["tokens"]),
            info=dict(last.info),
            loss_tokens=sums["loss_tokens"],
            stats=extra,
        )

    def _optimizer_step(self) -> bool:
        """Step the optimizer; return whether float16 loss scaling skipped the step.

        GradScaler leaves the weights alone when the scaled gradient holds an inf or NaN,
        and halves its scale; the scale dropping is the public sign of it. Hugging Face's
        Trainer then holds the learning-rate schedule too (``optimizer_step_was_skipped``),
        so the caller does: a skipped step must not use up warmup or decay.
        """
        if self.scaler is None:
            self.optimizer.step()
            return False
        scale = self.scaler.get_scale()
        self.scaler.step(self.optimizer)
        self.scaler.update()
        return self.scaler.get_scale() < scale

    def _result(
        self,
        loss: float,
        grad_norm: float,
        stats: dict[str, float],
        batch: PackedBatch,
        warmup: bool,
    ) -> StepResult:
        return StepResult(
            step=self.step,
            loss=loss,
            grad_norm=grad_norm,
            learning_rate=self.scheduler.get_last_lr()[0],
            kl=stats["kl"],
            entropy=stats["entropy"],
            clip_fraction=stats["clip_fraction"],
            real_token_share=batch.real_token_share,
            trained_tokens=batch.real_tokens,
            warmup=warmup,
            info=dict(batch.info),
            stats={k: v for k, v in stats.items() if k not in (*CORE_STATS, "loss_tokens")},
        )


def _accumulate(
    sums: dict[str, float], loss: float, stats: dict[str, float], batch: PackedBatch
) -> None:
    """Add a micro-batch to its step's sums: loss, tokens and slots summed, per-token
    statistics weighted by the micro-batch's loss tokens, maxima (``..._max``) kept."""
    weight = stats["loss_tokens"]
    added = {
        "loss": loss,
        "tokens": batch.real_tokens,
        "slots": batch.input_ids.numel(),
        "loss_tokens": weight,
        **{k: v * weight for k, v in stats.items() if k != "loss_tokens" and not is_max_stat(k)},
    }
    for key, value in added.items():
        sums[key] = sums.get(key, 0.0) + value
    for key, value in stats.items():
        if is_max_stat(key):
            sums[key] = max(sums.get(key, value), value)


def _extra_stats(acc: dict[str, float], tokens: float) -> dict[str, float]:
    """The step's statistics beyond the core ones: maxima as they are, means per token."""
    skip = {*CORE_STATS, "loss", "tokens", "slots", "loss_tokens"}
    return {k: (v if is_max_stat(k) else v / tokens) for k, v in acc.items() if k not in skip}


@contextlib.contextmanager
def eval_mode(model: Any):  # type: ignore[no-untyped-def]
    """Evaluation mode for rollouts, restored afterwards."""
    was_training = model.training
    model.eval()
    try:
        yield model
    finally:
        model.train(was_training)


def __getattr__(name: str) -> Any:
    """Names that left this module when the package got its rooms (:mod:`art_hydra.moved`)."""
    from art_hydra import moved

    return moved.old_attribute(__name__, name)
