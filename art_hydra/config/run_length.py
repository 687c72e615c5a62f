"""How many optimizer steps a run has: ``trainer.max_steps``, or the steps that
``trainer.num_train_epochs`` passes over the data take.

The arithmetic lives here, on the config alone (no torch, no files), so the world
pre-flight that counts the data (:mod:`art_hydra.preflight.epochs`), the composition
rules that read the run's length and the start summary all agree on it.

What one optimizer step consumes follows the producer (:mod:`art_hydra.engine.producer`):
RL samples a generation batch of ``per_device_train_batch_size / rl.num_generations``
prompt groups per rank x ``rl.steps_per_generation`` x the world size, and trains
``rl.steps_per_generation x rl.num_iterations`` steps on it; SFT takes
``per_device_train_batch_size x gradient_accumulation_steps x world size`` examples per
step. The data stream wraps into the next (reshuffled) epoch without a partial batch,
so a run is rounded up to whole steps (RL: whole generation batches): every example is
trained on at least ``num_train_epochs`` times when that is whole. Where the data fills
whole batches this is TRL's count (``ceil(num_train_epochs x steps per epoch)``); TRL
also drops a partial RL generation batch each epoch (its ``RepeatSampler`` keeps whole
batches only) and gives SFT's partial last batch a step of its own.
"""

from __future__ import annotations

import math
from collections.abc import Callable
from dataclasses import dataclass
from fractions import Fraction
from typing import Any

from art_hydra.config.schema import DEFAULT_MAX_STEPS, AlgorithmName

#: The flag :func:`decide_length` leaves on ``cfg.trainer`` when it set aside a
#: ``trainer.max_steps`` the config files gave, for the user's ``num_train_epochs``
#: (an OmegaConf node flag: it travels with the config through copies, and is no key).
SET_ASIDE = "art_hydra_files_max_steps_set_aside"


def _is_rl(cfg: Any) -> bool:
    return cfg.algorithm.name == AlgorithmName.rl


def sized_by_epochs(cfg: Any) -> bool:
    """Whether the run's length comes from the data: ``num_train_epochs`` set and
    ``max_steps`` null (composition decided it: :func:`decide_length`)."""
    return cfg.trainer.max_steps is None and cfg.trainer.num_train_epochs is not None


def decide_length(cfg: Any, typed: Callable[[str], bool] | None) -> None:
    """Decide, once and at composition, which key sizes the run (it needs no data), so
    that ``trainer.max_steps=None`` only ever means "sized by epochs" to a reader.

    ``typed(key)``: whether the user typed ``key`` (the command line, compose's
    overrides, a sweep's swept keys); None: a Python caller's config, all of it by hand.
    ``num_train_epochs`` the user typed beats a ``max_steps`` that came from config files
    alone (it is set aside: null, and the flag :data:`SET_ASIDE` says so for the dry run's
    note); a typed ``max_steps``, or both from files, wins over epochs (a validator
    warns); neither set is :data:`DEFAULT_MAX_STEPS`. Idempotent on a decided config."""
    t = cfg.trainer
    both = t.max_steps is not None and t.num_train_epochs is not None
    epochs_typed = typed is not None and typed("trainer.num_train_epochs")
    if both and epochs_typed and typed is not None and not typed("trainer.max_steps"):
        t.max_steps = None
        t._set_flag(SET_ASIDE, True)
        return
    if t.max_steps is not None:
        t._set_flag(SET_ASIDE, None)
    elif t.num_train_epochs is None:
        t.max_steps = DEFAULT_MAX_STEPS
        t._set_flag(SET_ASIDE, None)


def set_aside_note(cfg: Any) -> str | None:
    """The line that says a config file's ``trainer.max_steps`` gave way to the typed
    ``trainer.num_train_epochs`` (None: it did not)."""
    node = getattr(cfg, "trainer", None)
    if node is None or not hasattr(node, "_get_flag") or not node._get_flag(SET_ASIDE):
        return None
    return (
        f"note: trainer.num_train_epochs={node.num_train_epochs:g}, typed, sizes the run; "
        "the trainer.max_steps a config file set was set aside (a trainer.max_steps typed "
        "with it would win)."
    )


def known_steps(cfg: Any) -> int | None:
    """The run's steps as the config alone tells them: ``max_steps``, the default when
    neither key is set, None when the data sizes the run (the world pre-flight counts it)."""
    if cfg.trainer.max_steps is not None:
        return int(cfg.trainer.max_steps)
    return None if sized_by_epochs(cfg) else DEFAULT_MAX_STEPS


def _world(cfg: Any) -> int:
    return int(cfg.distributed.world_size or 1)


@dataclass(frozen=True)
class Consumption:
    """What the run's optimizer steps take from the data: ``per_block`` examples (RL:
    prompts) every ``block`` steps (RL: one generation batch; SFT: one step)."""

    per_block: int
    block: int
    unit: str

    @property
    def per_step(self) -> Fraction:
        return Fraction(self.per_block, self.block)


def consumption(cfg: Any) -> Consumption:
    """What ``cfg``'s steps consume, as the producer walks the data."""
    t = cfg.trainer
    if _is_rl(cfg):
        generations = int(cfg.rl.num_generations)
        groups = int(t.per_device_train_batch_size) // generations if generations > 0 else 0
        spg, iterations = int(cfg.rl.steps_per_generation), int(cfg.rl.num_iterations)
        return Consumption(groups * _world(cfg) * spg, spg * iterations, "prompts")
    rows = int(t.per_device_train_batch_size) * int(t.gradient_accumulation_steps)
    return Consumption(rows * _world(cfg), 1, "examples")


def exact(epochs: float) -> Fraction:
    """``epochs`` as the decimal it was written as (0.1 is 1/10, not float's 0.1000...01),
    so that 0.1 epoch of 30 examples in steps of 3 is 1 step, not 2."""
    return Fraction(repr(float(epochs)))


def steps_for_epochs(cfg: Any, examples: int, epochs: float | None = None) -> int | None:
    """The optimizer steps ``epochs`` (default ``trainer.num_train_epochs``) passes over
    ``examples`` training examples take: whole blocks (RL generation batches) rounded
    up, at least one. None where the config's steps consume no data (a batch smaller
    than a prompt group: an error its own check reports), so no count is made of it."""
    wanted = exact(cfg.trainer.num_train_epochs if epochs is None else epochs)
    use = consumption(cfg)
    if use.per_block <= 0 or use.block <= 0:
        return None
    blocks = max(1, math.ceil(wanted * examples / use.per_block))
    return blocks * use.block


def epochs_of(cfg: Any, steps: int, examples: int) -> float:
    """How many passes over ``examples`` training examples ``steps`` steps make."""
    use = consumption(cfg)
    if examples <= 0 or use.block <= 0:
        return 0.0
    return float(steps * use.per_step / examples)


def steps_named(cfg: Any, steps: int) -> str:
    """The run's ``steps`` with the setting they come from, for a message."""
    t = cfg.trainer
    if t.max_steps is not None:
        return f"trainer.max_steps={steps}"
    if t.num_train_epochs is not None:
        return f"{steps} steps, from trainer.num_train_epochs={t.num_train_epochs:g}"
    return f"{steps} steps, trainer.max_steps=null's default"
