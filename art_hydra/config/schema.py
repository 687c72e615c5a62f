"""The typed schema of a run: one dataclass per config section.

These dataclasses are the only place where defaults live. The YAML files under
``conf/`` select and override them; code reads values from the composed config and
never restates a default. Field names follow Hugging Face ``TrainingArguments`` and
TRL ``GRPOConfig`` so users can carry their knowledge over. Choices are ``Enum``s
because OmegaConf rejects ``Literal`` annotations.

Single-field limits sit next to each field (``bounded(...)``, checked by one walker in
:mod:`art_hydra.config.bounds`); rules between fields are validators.

This module is on the compose/validate path: it must import nothing heavier than
``omegaconf`` (no torch, transformers, peft or unsloth).
"""

from __future__ import annotations

import threading
from dataclasses import dataclass, field
from enum import Enum
from typing import Any

from omegaconf import MISSING

from art_hydra.config.bounds import bounded, section


class AlgorithmName(Enum):
    """Which training algorithm drives the run."""

    rl = "rl"
    sft = "sft"


class BackendName(Enum):
    """Which library loads and trains the model."""

    torch = "torch"
    unsloth = "unsloth"


class Device(Enum):
    """Where the model runs; ``auto`` picks CUDA when torch sees a GPU."""

    auto = "auto"
    cpu = "cpu"
    cuda = "cuda"


class DType(Enum):
    """Parameter dtype; ``auto`` uses the checkpoint's dtype (float32 for the tiny model).

    ``float16`` trains in mixed precision: float32 master weights, float16 autocast in
    the forward pass and loss scaling (as Hugging Face's Trainer does for fp16); pure
    float16 weights overflow within a few steps.
    """

    auto = "auto"
    float32 = "float32"
    bfloat16 = "bfloat16"
    float16 = "float16"


class FinetuneMethod(Enum):
    """Train LoRA adapters or every weight."""

    lora = "lora"
    full = "full"


class SchedulerType(Enum):
    """Learning-rate schedule, named as in ``transformers.SchedulerType``."""

    constant = "constant"
    constant_with_warmup = "constant_with_warmup"
    linear = "linear"
    cosine = "cosine"


class LossType(Enum):
    """Policy-gradient loss: PPO-style clipped ratio, or CISPO's clipped importance weight."""

    ppo_clip = "ppo_clip"
    cispo = "cispo"


class DistBackend(Enum):
    """torch.distributed backend: ``auto`` is nccl on CUDA, gloo on the CPU."""

    auto = "auto"
    gloo = "gloo"
    nccl = "nccl"


class TaskSource(Enum):
    """Where a task's examples come from."""

    generated = "generated"
    jsonl = "jsonl"


class ModelSource(Enum):
    """Where the weights come from: a pretrained checkpoint, or a tiny model built locally."""

    pretrained = "pretrained"
    tiny = "tiny"


#: Longest wait ``threading`` accepts (seconds); a larger timeout crashes the wait itself.
WAIT_MAX_S = float(threading.TIMEOUT_MAX)


@dataclass
class LoraConfig:
    """LoRA adapter settings (used when ``model.finetune=lora``)."""

    # Adapter rank; higher ranks train more parameters.
    r: int = bounded(16, ge=1, why="the rank of the adapter matrices.")
    # LoRA scaling numerator; the update is scaled by alpha / r.
    alpha: int = bounded(32, gt=0, why="the adapter update is scaled by alpha / r.")
    # Dropout applied to the adapter input, in [0, 1).
    dropout: float = bounded(0.0, ge=0, lt=1, why="a dropout probability.")
    # Module names that receive adapters (matched against the model's module names).
    target_modules: list[str] = bounded(
        factory=lambda: [
            "q_proj",
            "k_proj",
            "v_proj",
            "o_proj",
            "gate_proj",
            "up_proj",
            "down_proj",
        ],
        nonempty=True,
        why="with no target, peft would silently pick its own default modules; name the "
        "modules to adapt, or train every weight with model.finetune=full.",
    )
    # Modules trained in full next to the adapters (for example lm_head on a fresh model).
    modules_to_save: list[str] = field(default_factory=list)


@dataclass
class TinyModelConfig:
    """Architecture of the small Llama built locally, with no hub access."""

    # Width of the residual stream.
    hidden_size: int = bounded(64, ge=1)
    # Number of decoder layers.
    num_layers: int = bounded(2, ge=1)
    # Attention heads; must divide hidden_size into heads of even width.
    num_heads: int = bounded(4, ge=1)
    # Width of the MLP.
    intermediate_size: int = bounded(256, ge=1)
    # Standard deviation of the random initialisation.
    init_std: float = bounded(0.02, gt=0)


@dataclass
class ModelConfig:
    """Which model to train and how its weights are adapted."""

    # Hugging Face hub id or local path (source=pretrained); a label for source=tiny.
    name: str = bounded(MISSING, nonempty=True)
    # pretrained: from_pretrained(name) from a local path or the hub cache; tiny: built locally.
    source: ModelSource = ModelSource.pretrained
    # Longest sequence (prompt plus completion) the model will see.
    max_seq_length: int = bounded(1024, ge=1)
    # Parameter dtype.
    dtype: DType = DType.auto
    # Load the base weights quantised to 4 bits (QLoRA); needs backend=unsloth.
    load_in_4bit: bool = False
    # Train LoRA adapters or all weights.
    finetune: FinetuneMethod = FinetuneMethod.lora
    # LoRA settings.
    lora: LoraConfig = section(LoraConfig, when=("model.finetune", FinetuneMethod.lora))
    # Architecture of the model built when source=tiny.
    tiny: TinyModelConfig = section(TinyModelConfig, when=("model.source", ModelSource.tiny))
    # Hub revision (branch, tag or commit) to load.
    revision: str | None = None
    # Run the modelling code shipped with the checkpoint (only from the command line).
    trust_remote_code: bool = False


@dataclass
class BackendConfig:
    """The library that loads and trains the model."""

    # torch: transformers + peft, any device; unsloth: Unsloth's fast kernels.
    name: BackendName = BackendName.torch
    # Device to train on.
    device: Device = Device.auto
    # Trade compute for memory by recomputing activations in backward.
    gradient_checkpointing: bool = False
    # Threads torch computes with on the CPU (null: torch's default, one per core). Where
    # other work keeps the cores busy, 1 is far faster: every parallel op waits for its
    # slowest thread, and a thread the OS has put aside stalls it (4.7x on 2 busy cores).
    # A resume may change it; like another machine, it changes float rounding only.
    cpu_threads: int | None = bounded(None, ge=1)


@dataclass
class AlgorithmConfig:
    """Which algorithm the run uses; its settings live in the `rl` or `sft` section."""

    # rl: GRPO-style policy optimisation from rewards; sft: supervised fine-tuning.
    name: AlgorithmName = AlgorithmName.rl


@dataclass
class TrainerConfig:
    """Optimisation settings shared by RL and SFT (names as in TrainingArguments)."""

    # Peak learning rate.
    learning_rate: float = bounded(
        1e-5, gt=0, why="with a zero or negative rate the weights never improve."
    )
    # Sequences per forward/backward pass (completions in RL, examples in SFT).
    per_device_train_batch_size: int = bounded(8, ge=1)
    # Micro-batches per optimizer step; RL requires 1 (see the README).
    gradient_accumulation_steps: int = bounded(
        1, ge=1, why="it counts the micro-batches that make one optimizer step."
    )
    # Optimizer steps in the run.
    max_steps: int = bounded(100, ge=1)
    # Gradient-norm clipping threshold; 0 disables clipping.
    max_grad_norm: float = bounded(1.0, ge=0, why="0 disables clipping.")
    # AdamW decoupled weight decay (not applied to biases, norms and embeddings).
    weight_decay: float = bounded(0.0, ge=0, why="negative decay grows weights without bound.")
    # Steps of linear learning-rate warmup.
    warmup_steps: int = bounded(0, ge=0)
    # Learning-rate schedule after warmup.
    lr_scheduler_type: SchedulerType = SchedulerType.constant
    # AdamW beta1.
    adam_beta1: float = bounded(0.9, ge=0, lt=1, why="the decay rate of a running average.")
    # AdamW beta2.
    adam_beta2: float = bounded(0.999, ge=0, lt=1, why="the decay rate of a running average.")
    # AdamW epsilon.
    adam_epsilon: float = bounded(1e-8, gt=0, why="AdamW divides by sqrt(v) + epsilon.")
    # Run one forward/backward on the first input before training (allocates memory,
    # compiles kernels); changes no weight and no optimizer moment.
    warmup_pass: bool = False


@dataclass
class RLConfig:
    """GRPO-family settings (names as in TRL's GRPOConfig)."""

    # Completions sampled per prompt; advantages are normalised within each group.
    num_generations: int = bounded(
        8,
        ge=2,
        why="advantages are rewards normalised within a group of completions of one prompt, "
        "and a group of one always has advantage 0.",
    )
    # Longest prompt, in tokens (chat template included); longer prompts are refused.
    max_prompt_length: int = bounded(256, ge=1)
    # Most tokens generated per completion.
    max_completion_length: int = bounded(256, ge=1, why="there would be nothing to reward.")
    # Sampling temperature for rollouts (also applied to training logprobs).
    temperature: float = bounded(
        1.0, gt=0, why="logits are divided by it, and GRPO needs differing completions."
    )
    # Nucleus sampling threshold in (0, 1].
    top_p: float = bounded(1.0, gt=0, le=1, why="the share of probability mass kept.")
    # Top-k sampling; 0 disables it.
    top_k: int = bounded(0, ge=0, why="0 disables top-k.")
    # Weight of the KL penalty to the reference policy; 0 disables it.
    beta: float = bounded(0.0, ge=0, why="a negative weight rewards drifting from the reference.")
    # Lower clip range of the importance ratio (1 - epsilon).
    epsilon: float = bounded(
        0.2, gt=0, lt=1, why="the ratio is clipped below at 1 - epsilon, which must stay positive."
    )
    # ppo_clip: upper clip range 1 + epsilon_high (unset: epsilon; larger is DAPO's
    # clip-higher). cispo: the cap on the importance weight itself, as in TRL (5.0 is
    # ScaleRL's value); required with cispo.
    epsilon_high: float | None = bounded(None, gt=0)
    # Passes over each generation batch (TRL's num_iterations); more than 1 reuses
    # rollouts, so the ratio moves off 1 and clipping acts.
    num_iterations: int = bounded(1, ge=1)
    # Optimizer steps each generation batch is split into (TRL's steps_per_generation): a
    # generation samples per_device_train_batch_size x this many completions.
    steps_per_generation: int = bounded(1, ge=1)
    # Policy-gradient loss.
    loss_type: LossType = LossType.ppo_clip
    # Divide group-centred rewards by the group's standard deviation.
    scale_rewards: bool = True
    # Sample the next generation batch on a copy of the policy while the trainer trains
    # on this one: one optimizer step off-policy, corrected by the importance ratio to
    # the sampling policy (clipped by epsilon). Doubles the model's memory.
    overlap_rollouts: bool = False


@dataclass
class SFTConfig:
    """Supervised fine-tuning settings (names as in TRL's SFTConfig)."""

    # Longest training example (prompt plus answer), in tokens; longer ones are refused.
    max_length: int = bounded(1024, ge=1)
    # Compute the loss on answer tokens only, not on the prompt.
    completion_only_loss: bool = True


@dataclass
class ProducerConfig:
    """The side that turns prompts into packed training inputs and awaits each step's result."""

    # Shuffle the task's examples before each pass over them.
    shuffle: bool = True
    # Completions per step saved to completions.jsonl in the run directory, for inspection.
    log_completions: int = bounded(2, ge=0)
    # Lay sequences that share a prompt (a group's completions) out behind one copy of it,
    # each attending to that copy and to itself: the same loss and gradient, with the
    # prompt computed once per group instead of once per completion. Only where rows pack
    # (the run log names the layout); false repeats the prompt for every completion.
    share_prompts: bool = True


_TIMEOUT_WHY = (
    "every wait is bounded, so stuck work stops the run with an error naming it instead of "
    "hanging, and a thread wait accepts at most threading.TIMEOUT_MAX seconds."
)


def _timeout(default: float) -> Any:
    return bounded(default, gt=0, le=WAIT_MAX_S, float32=False, why=_TIMEOUT_WHY)


@dataclass
class QueueConfig:
    """The producer <-> trainer channel; deadlocks on it are detected at once."""

    # Seconds the trainer waits for its next input while the producer is in none of its
    # bounded phases (sampling, scoring, checkpointing each have their own bound).
    input_timeout_s: float = _timeout(600.0)
    # Inputs that may wait on the queue; 1 keeps training on-policy.
    maxsize: int = bounded(1, ge=1)


@dataclass
class TimeoutsConfig:
    """A bound for each kind of work, so stuck work stops the run naming what overran."""

    # Seconds to sample one generation batch of rollouts.
    rollout_s: float = _timeout(1800.0)
    # Seconds to score one generation batch with the reward function.
    reward_s: float = _timeout(600.0)
    # Seconds for one optimizer step (the producer's wait for its result).
    step_s: float = _timeout(1800.0)
    # Seconds to write one checkpoint.
    checkpoint_s: float = _timeout(1800.0)


@dataclass
class DistributedConfig:
    """Data-parallel training over ranks started by torchrun or a SLURM job (one rank per
    process; trainer.per_device_train_batch_size is per rank)."""

    # Ranks the run is planned for; null reads WORLD_SIZE from the launcher (1 without one).
    world_size: int | None = bounded(None, ge=1)
    # Collective backend.
    backend: DistBackend = DistBackend.auto
    # Seconds a collective waits for the other ranks before the run stops naming them.
    timeout_s: float = _timeout(300.0)


@dataclass
class RewardConfig:
    """The task's reward function, named by `_target_`."""

    # Dotted path of a @reward function, called as f(prompt=, completion=, answer=) -> float.
    _target_: str = MISSING


@dataclass
class TaskConfig:
    """What the model is trained on, and how completions are scored."""

    # Short label used in logs and run names.
    name: str = bounded(MISSING, nonempty=True)
    # Where examples come from: a generator function or a JSONL file.
    source: TaskSource = TaskSource.generated
    # Dotted path of the @generator function (source=generated).
    generator: str | None = None
    # JSONL file with one {"prompt": ..., "answer": ...} object per line (source=jsonl).
    path: str | None = None
    # Examples drawn from the generator.
    num_examples: int = bounded(2000, ge=1, when=("task.source", TaskSource.generated))
    # Keyword arguments passed to the generator.
    params: dict[str, Any] = field(default_factory=dict)
    # Reward function.
    reward: RewardConfig = field(default_factory=RewardConfig)
    # Modules whose unmarked functions reward and generator may name (command line only).
    allowed_modules: list[str] = field(default_factory=list)


@dataclass
class CheckpointConfig:
    """When and where checkpoints are written."""

    # Save every N optimizer steps; 0 saves only at the end of the run.
    every_steps: int = bounded(50, ge=0, why="0 saves only at the end.")
    # Checkpoints kept on disk (oldest deleted first).
    keep_last: int = bounded(2, ge=1, why="resume needs a checkpoint to load.")
    # Folder inside the run directory.
    dir: str = bounded("checkpoints", nonempty=True)


@dataclass
class LoggingConfig:
    """What a run reports while it trains."""

    # Write metrics every N steps.
    every_steps: int = bounded(1, ge=1)
    # Write TensorBoard event files.
    tensorboard: bool = True
    # Draw the reward curve to a PNG at the end.
    plot: bool = True
    # Progress bar: auto (only on a terminal), on or off (YAML's bare on/off/true/false work).
    progress_bar: str = bounded(
        "auto",
        choices=("auto", "on", "off"),
        aliases=(("True", "on"), ("true", "on"), ("False", "off"), ("false", "off")),
    )


@dataclass
class RunConfig:
    """A whole run: every section plus the run-level switches."""

    # Model to train.
    model: ModelConfig = field(default_factory=ModelConfig)
    # Library that loads and trains it.
    backend: BackendConfig = field(default_factory=BackendConfig)
    # RL or SFT.
    algorithm: AlgorithmConfig = field(default_factory=AlgorithmConfig)
    # Optimisation settings.
    trainer: TrainerConfig = field(default_factory=TrainerConfig)
    # RL settings (used when algorithm=rl).
    rl: RLConfig = section(RLConfig, when=("algorithm.name", AlgorithmName.rl))
    # SFT settings (used when algorithm=sft).
    sft: SFTConfig = section(SFTConfig, when=("algorithm.name", AlgorithmName.sft))
    # Rollout producer.
    producer: ProducerConfig = field(default_factory=ProducerConfig)
    # Producer <-> trainer queue.
    queue: QueueConfig = field(default_factory=QueueConfig)
    # Bounds on rollouts, rewards, optimizer steps and checkpoint writes.
    timeouts: TimeoutsConfig = field(default_factory=TimeoutsConfig)
    # Data-parallel training over several processes.
    distributed: DistributedConfig = field(default_factory=DistributedConfig)
    # Training data and reward.
    task: TaskConfig = field(default_factory=TaskConfig)
    # Checkpointing.
    checkpoint: CheckpointConfig = field(default_factory=CheckpointConfig)
    # Metrics, TensorBoard and plots.
    logging: LoggingConfig = field(default_factory=LoggingConfig)
    # Seed for model init, sampling and data order.
    seed: int = bounded(42, ge=-(2**63), le=2**64 - 1, why="torch seeds with a 64-bit integer.")
    # Validate and print the resolved config, then exit without training.
    dry_run: bool = False
    # Continue from the last complete checkpoint in the run directory.
    resume: bool = False
    # Treat warnings as errors: refuse a configuration that only looks like a mistake.
    strict: bool = False
