"""The typed schema of a run: one dataclass per config section.

These dataclasses are the only place where defaults live. The YAML files under
``conf/`` select and override them; code reads values from the composed config and
never restates a default. Field names follow Hugging Face ``TrainingArguments`` and
TRL ``GRPOConfig`` so users can carry their knowledge over. Choices are ``Enum``s
because OmegaConf rejects ``Literal`` annotations.

Each key is declared once, on its field (``setting(...)`` / ``section(...)`` from
:mod:`art_hydra.config.bounds`): its help text, its single-field limits (checked by one
walker), whether a resume may change it (``resume=MAY_CHANGE``; fixed otherwise) and,
for a key added after run folders were first written, the value that reproduces runs
saved before it existed (``legacy=``). Reports, ``--help``, the key table (docs/config-keys.md) and
the resume comparison read them through :mod:`art_hydra.config.fields`; rules between
fields are validators. Help states behaviour only, never benchmark figures.

This module is on the compose/validate path: it must import nothing heavier than
``omegaconf`` (no torch, transformers, peft or unsloth).
"""

from __future__ import annotations

import threading
from dataclasses import dataclass
from enum import Enum
from typing import Any

from omegaconf import MISSING

from art_hydra.config.bounds import MAY_CHANGE, section, setting
from art_hydra.config.tracker_names import LIBRARIES, NONE, TENSORBOARD


class AlgorithmName(Enum):
    """Which training algorithm drives the run."""

    rl = "rl"
    sft = "sft"


class Device(Enum):
    """Where the model runs; ``auto`` picks CUDA when torch sees a GPU."""

    auto = "auto"
    cpu = "cpu"
    cuda = "cuda"


class DType(Enum):
    """Parameter dtype; ``auto`` uses the checkpoint's dtype (float32 for the tiny model).

    A half type (``float16``, ``bfloat16``, or ``auto`` on a half checkpoint) trains in
    mixed precision: float32 master weights and optimizer state, the forward pass (in
    training and in sampling) under autocast to the half type, and for float16 loss
    scaling, as Hugging Face's Trainer does for fp16/bf16. Pure float16 weights overflow
    within a few steps; pure bfloat16 weights (``model.master_weights=false``) round most
    small updates away. LoRA keeps a half base frozen and its adapters in float32.
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


class DistBackend(Enum):
    """torch.distributed backend: ``auto`` is nccl on CUDA, gloo on the CPU."""

    auto = "auto"
    gloo = "gloo"
    nccl = "nccl"


class DistStrategy(Enum):
    """How the ranks split training: ``ddp`` keeps a whole copy of the weights, gradients
    and optimizer state on every rank; ``fsdp`` shards them (FSDP2, ``fully_shard``)."""

    ddp = "ddp"
    fsdp = "fsdp"


class TaskSource(Enum):
    """Where a task's examples come from."""

    generated = "generated"
    jsonl = "jsonl"
    #: Files (json, jsonl, csv, parquet), a folder of them, a ``save_to_disk`` folder or a
    #: cached hub dataset, in TRL's formats, read through the ``datasets`` library.
    dataset = "dataset"


class ObjectiveReduce(Enum):
    """How the objective's metric is reduced over the last ``objective.window`` logged steps."""

    last = "last"
    mean = "mean"
    max = "max"
    min = "min"


class ObjectiveDirection(Enum):
    """Whether a larger or a smaller objective is better; ``auto`` minimises loss-like
    metrics (loss, kl, grad_norm, clip_fraction, zero_std_groups, step_time_s,
    sampling_mismatch_mean and _max) and maximises the others."""

    auto = "auto"
    maximize = "maximize"
    minimize = "minimize"


class ModelSource(Enum):
    """Where the weights come from: a pretrained checkpoint, or a tiny model built locally."""

    pretrained = "pretrained"
    tiny = "tiny"


#: The sequence room ``model.max_seq_length=null`` derives (at least this, or the token
#: budgets where they need more), cut to the model's own positions: a pretrained model
#: gets a length it holds without the user naming one.
DERIVED_SEQUENCE_ROOM = 2048

#: Longest wait ``threading`` accepts (seconds); a larger timeout crashes the wait itself.
WAIT_MAX_S = float(threading.TIMEOUT_MAX)


@dataclass
class LoraConfig:
    """LoRA adapter settings (used when ``model.finetune=lora``)."""

    r: int = setting(
        16,
        ge=1,
        why="the rank of the adapter matrices.",
        help="Adapter rank; higher ranks train more parameters.",
    )
    alpha: int = setting(
        32,
        gt=0,
        why="the adapter update is scaled by alpha / r.",
        help="LoRA scaling numerator; the update is scaled by alpha / r.",
    )
    dropout: float = setting(
        0.0,
        ge=0,
        lt=1,
        why="a dropout probability.",
        help="Dropout applied to the adapter input, in [0, 1).",
    )
    target_modules: list[str] = setting(
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
        help="Module names that receive adapters (matched against the model's module names).",
    )
    modules_to_save: list[str] = setting(
        factory=list,
        help=(
            "Modules trained in full next to the adapters (for example lm_head on a fresh model)."
        ),
    )


@dataclass
class TinyModelConfig:
    """Architecture of the small Llama built locally, with no hub access."""

    hidden_size: int = setting(64, ge=1, help="Width of the residual stream.")
    num_layers: int = setting(2, ge=1, help="Number of decoder layers.")
    num_heads: int = setting(
        4, ge=1, help="Attention heads; must divide hidden_size into heads of even width."
    )
    intermediate_size: int = setting(256, ge=1, help="Width of the MLP.")
    init_std: float = setting(0.02, gt=0, help="Standard deviation of the random initialisation.")


@dataclass
class ModelConfig:
    """Which model to train and how its weights are adapted."""

    name: str = setting(
        MISSING,
        nonempty=True,
        help="Hugging Face hub id or local path (source=pretrained); a label for source=tiny.",
    )
    source: ModelSource = setting(
        ModelSource.pretrained,
        help=(
            "pretrained: from_pretrained(name) from a local path or the hub cache; tiny: built "
            "locally."
        ),
    )
    max_seq_length: int | None = setting(
        None,
        ge=1,
        help=(
            "Longest sequence (prompt plus completion) the model will see. null: derived "
            f"from the model: the token budgets' room (at least {DERIVED_SEQUENCE_ROOM}), cut "
            "to the positions its config.json holds (max_position_embeddings). A value set "
            "here must fit those positions."
        ),
    )
    dtype: DType = setting(
        DType.auto,
        help=(
            "Parameter dtype. A half type (float16, bfloat16, or auto on a half checkpoint) "
            "computes under autocast to it, in training and sampling alike; see "
            "model.master_weights for the weights that train."
        ),
    )
    master_weights: bool = setting(
        True,
        help=(
            "With a half dtype and model.finetune=full: keep the trained weights and the AdamW "
            "state in float32 and compute under autocast to the half type (mixed precision, as "
            "Hugging Face's Trainer does). false trains pure bfloat16 weights, which round away "
            "updates smaller than half a bfloat16 step of the weight (a warning measures the "
            "share at load); float16 needs float32 masters. No effect under LoRA (adapters are "
            "float32), Unsloth or float32. A resume may change it: weights and moments are cast "
            "as they load."
        ),
        resume=MAY_CHANGE,
        legacy=False,
    )
    load_in_4bit: bool = setting(
        False, help="Load the base weights quantised to 4 bits (QLoRA); needs backend=unsloth."
    )
    finetune: FinetuneMethod = setting(
        FinetuneMethod.lora, help="Train LoRA adapters or all weights."
    )
    lora: LoraConfig = section(
        LoraConfig, when=("model.finetune", FinetuneMethod.lora), help="LoRA settings."
    )
    tiny: TinyModelConfig = section(
        TinyModelConfig,
        when=("model.source", ModelSource.tiny),
        help="Architecture of the model built when source=tiny.",
    )
    revision: str | None = setting(None, help="Hub revision (branch, tag or commit) to load.")
    chat_template: str | None = setting(
        None,
        help=(
            "A chat template to use instead of the tokenizer's own (TRL's chat_template_path): "
            "a .jinja file, or the name of one shipped in art_hydra/templates (tools: the tiny "
            "model's tool-call template). For a training template that keeps earlier turns "
            "unchanged, or a model without one. Saved with checkpoints and exports."
        ),
        legacy=None,
    )
    trust_remote_code: bool = setting(
        False,
        help="Run the modelling code shipped with the checkpoint (only from the command line).",
    )


@dataclass
class BackendConfig:
    """The library that loads and trains the model."""

    name: str = setting(
        "torch",
        help=(
            "The backend: a name registered with register_backend "
            "(art_hydra.config.backends): torch (transformers + peft, any device), unsloth "
            "(Unsloth's fast kernels), or one a plugin or launcher script registers."
        ),
        registry="backend",
    )
    device: Device = setting(Device.auto, help="Device to train on.")
    gradient_checkpointing: bool = setting(
        False, help="Trade compute for memory by recomputing activations in backward."
    )
    cpu_threads: int | None = setting(
        None,
        ge=1,
        help=(
            "Threads torch computes with on the CPU (null: torch's default, one per core). Where "
            "other work keeps the cores busy, 1 is far faster: every parallel op waits for its "
            "slowest thread, and a thread the OS has put aside stalls it. A resume may change "
            "it; like another machine, it changes float rounding only. Left null, a CPU run "
            "that starts on a busy machine (load average at half the cores or more) says so."
        ),
        resume=MAY_CHANGE,
        legacy=None,
    )


@dataclass
class AlgorithmConfig:
    """Which algorithm the run uses; its settings live in the `rl` or `sft` section."""

    name: AlgorithmName = setting(
        AlgorithmName.rl,
        help="rl: GRPO-style policy optimisation from rewards; sft: supervised fine-tuning.",
    )


#: Optimizer steps of a run that sets neither ``trainer.max_steps`` nor
#: ``trainer.num_train_epochs`` (``trainer.max_steps=null``'s meaning then).
DEFAULT_MAX_STEPS = 100


@dataclass
class TrainerConfig:
    """Optimisation settings shared by RL and SFT (names as in TrainingArguments)."""

    learning_rate: float = setting(
        1e-5,
        gt=0,
        why="with a zero or negative rate the weights never improve.",
        help="Peak learning rate.",
    )
    per_device_train_batch_size: int = setting(
        8, ge=1, help="Sequences per forward/backward pass (completions in RL, examples in SFT)."
    )
    gradient_accumulation_steps: int = setting(
        1,
        ge=1,
        why="it counts the micro-batches that make one optimizer step.",
        help="Micro-batches per optimizer step; RL requires 1 (its producer waits for each "
        "step's result).",
    )
    max_steps: int | None = setting(
        None,
        ge=1,
        help=(
            "Optimizer steps in the run. Typed by the user, or set with trainer.num_train_epochs "
            "by config files alone, it wins over the epochs (as in TRL, with a warning); a "
            "config file's value gives way to a trainer.num_train_epochs the user typed. "
            "null: sized by trainer.num_train_epochs when that is set, else "
            f"{DEFAULT_MAX_STEPS} steps (composition fills it in). The run records the number "
            "it trains."
        ),
        resume=MAY_CHANGE,
    )
    num_train_epochs: float | None = setting(
        None,
        gt=0,
        why="a run of no data trains nothing.",
        help=(
            "Size the run from the data, as TrainingArguments does: passes over the training "
            "examples (RL: prompts, after eval.fraction's held-out share), fractions allowed, "
            "rounded up to whole steps (RL: whole generation batches). Typed on the command "
            "line it sets aside a trainer.max_steps from a config file; a trainer.max_steps "
            "typed too wins. The world pre-flight counts the data and records the steps as "
            "trainer.max_steps."
        ),
        resume=MAY_CHANGE,
        legacy=None,
    )
    max_grad_norm: float = setting(
        1.0,
        ge=0,
        why="0 disables clipping.",
        help="Gradient-norm clipping threshold; 0 disables clipping.",
    )
    weight_decay: float = setting(
        0.0,
        ge=0,
        why="negative decay grows weights without bound.",
        help=(
            "AdamW decoupled weight decay; as Hugging Face's Trainer, not applied to biases "
            "and norm weights (embeddings decay)."
        ),
    )
    warmup_steps: int = setting(0, ge=0, help="Steps of linear learning-rate warmup.")
    lr_scheduler_type: SchedulerType = setting(
        SchedulerType.constant, help="Learning-rate schedule after warmup."
    )
    adam_beta1: float = setting(
        0.9, ge=0, lt=1, why="the decay rate of a running average.", help="AdamW beta1."
    )
    adam_beta2: float = setting(
        0.999, ge=0, lt=1, why="the decay rate of a running average.", help="AdamW beta2."
    )
    adam_epsilon: float = setting(
        1e-8, gt=0, why="AdamW divides by sqrt(v) + epsilon.", help="AdamW epsilon."
    )
    warmup_pass: bool = setting(
        False,
        help=(
            "Run one forward/backward on the first input before training (allocates memory, "
            "compiles kernels); changes no weight and no optimizer moment."
        ),
    )


@dataclass
class RLConfig:
    """GRPO-family settings (names as in TRL's GRPOConfig)."""

    num_generations: int = setting(
        8,
        ge=2,
        why="advantages are rewards normalised within a group of completions of one prompt, "
        "and a group of one always has advantage 0.",
        help="Completions sampled per prompt; advantages are normalised within each group.",
    )
    max_prompt_length: int = setting(
        256,
        ge=1,
        help="Longest prompt, in tokens (chat template included); longer prompts are refused.",
    )
    max_completion_length: int = setting(
        256,
        ge=1,
        why="there would be nothing to reward.",
        help="Most tokens generated per completion.",
    )
    temperature: float = setting(
        1.0,
        gt=0,
        why="logits are divided by it, and GRPO needs differing completions.",
        help="Sampling temperature for rollouts (also applied to training logprobs).",
    )
    top_p: float = setting(
        1.0,
        gt=0,
        le=1,
        why="the share of probability mass kept.",
        help="Nucleus sampling threshold in (0, 1].",
    )
    top_k: int = setting(0, ge=0, why="0 disables top-k.", help="Top-k sampling; 0 disables it.")
    beta: float = setting(
        0.0,
        ge=0,
        why="a negative weight rewards drifting from the reference.",
        help="Weight of the KL penalty to the reference policy; 0 disables it.",
    )
    epsilon: float = setting(
        0.2,
        gt=0,
        lt=1,
        why="the ratio is clipped below at 1 - epsilon, which must stay positive.",
        help="Lower clip range of the importance ratio (1 - epsilon).",
    )
    epsilon_high: float | None = setting(
        None,
        gt=0,
        help=(
            "ppo_clip: upper clip range 1 + epsilon_high (unset: epsilon; larger is DAPO's "
            "clip-higher). cispo: the cap on the importance weight itself, as in TRL (5.0 is "
            "ScaleRL's value); required with cispo."
        ),
    )
    num_iterations: int = setting(
        1,
        ge=1,
        help=(
            "Passes over each generation batch (TRL's num_iterations); more than 1 reuses "
            "rollouts, so the ratio moves off 1 and clipping acts."
        ),
        legacy=1,
    )
    steps_per_generation: int = setting(
        1,
        ge=1,
        help=(
            "Optimizer steps each generation batch is split into (TRL's steps_per_generation): a "
            "generation samples per_device_train_batch_size x this many completions."
        ),
        legacy=1,
    )
    loss_type: str = setting(
        "ppo_clip",
        help=(
            "Policy-gradient loss: a name registered with @register_policy_loss "
            "(art_hydra.engine.rl.losses): ppo_clip (PPO's clipped ratio), cispo (CISPO's capped "
            "importance weight), or one a plugin or launcher script registers."
        ),
        registry="policy_loss",
    )
    loss_aggregation: str = setting(
        "dapo",
        choices=("dapo", "grpo", "bnpo", "dr_grpo"),
        help=(
            "How the masked per-token terms (policy and KL) are averaged, by TRL's loss_type "
            "names: dapo (the step's token sum / the generation batch's trained tokens per "
            "step, over every rank), grpo (each completion's token mean, then the mean over "
            "completions), bnpo (the step's token mean on each rank), dr_grpo (the sum / "
            "(completions x rl.max_completion_length)). TRL's loss_type=dapo is "
            "rl.loss_type=ppo_clip rl.loss_aggregation=dapo here."
        ),
        legacy="dapo",
    )
    scale_rewards: bool = setting(
        True, help="Divide group-centred rewards by the group's standard deviation."
    )
    max_tool_calls: int = setting(
        8,
        ge=1,
        legacy=8,
        help=(
            "Most tool calls in one trajectory (TRL's max_tool_calling_iterations); the "
            "trajectory also ends when rl.max_completion_length runs out. Used with "
            "task.environment or task.tools."
        ),
    )
    sft_warm_start_steps: int = setting(
        0,
        ge=0,
        legacy=0,
        help=(
            "SFT steps on the task's demonstrations (examples with a conversation to imitate) "
            "before the first RL step of a new run, to teach a fresh model a format (tool "
            "calls) that RL then improves; 0: none. Not repeated on a resume."
        ),
    )
    sft_warm_start_learning_rate: float | None = setting(
        None,
        gt=0,
        legacy=None,
        why="a step of zero or against the gradient teaches nothing.",
        help=(
            "Learning rate of the SFT warm start (rl.sft_warm_start_steps); null: "
            "trainer.learning_rate. Imitation tolerates a larger rate than RL: Adam's first "
            "RL steps move every weight by about the learning rate."
        ),
    )
    advantage_estimator: str = setting(
        "group_relative",
        help=(
            "How a group's rewards become advantages: a name registered with "
            "@register_advantage_estimator (art_hydra.engine.rl.advantages): group_relative (GRPO: "
            "the reward minus the group mean, over the group's std under rl.scale_rewards), "
            "or one a plugin or launcher script registers."
        ),
        registry="advantage_estimator",
        legacy="group_relative",
    )
    importance_sampling_cap: float | None = setting(
        None,
        gt=0,
        why="the cap is a bound on a ratio of probabilities, which is positive.",
        help=(
            "Truncated importance sampling between the sampler and the training forward (TRL's "
            "vllm_importance_sampling_cap, token_truncate): each token's policy term is "
            "multiplied by min(exp(old - sampler logprob), cap), detached. null: no correction "
            "(the sampling_mismatch metrics still report the gap)."
        ),
        legacy=None,
    )
    importance_sampling_mode: str = setting(
        "token_truncate",
        choices=("token_truncate", "token_mask", "sequence_truncate", "sequence_mask"),
        help=(
            "How rl.importance_sampling_cap corrects the sampler/trainer gap (TRL's "
            "vllm_importance_sampling_mode): token_truncate weighs each token by min(ratio, cap); "
            "token_mask drops tokens whose ratio exceeds the cap; sequence_truncate and "
            "sequence_mask do the same with one ratio per completion, exp(sum of the token log "
            "ratios) (the TIS and MIS of the literature). Read only when the cap is set."
        ),
        resume=MAY_CHANGE,
        legacy="token_truncate",
    )
    overlap_rollouts: bool = setting(
        False,
        help=(
            "Sample the next generation batch on a copy of the policy while the trainer trains "
            "on this one: one optimizer step off-policy, corrected by the importance ratio to "
            "the sampling policy (clipped by epsilon). Doubles the model's memory."
        ),
        legacy=False,
    )


@dataclass
class VLLMConfig:
    """vLLM's own settings (``rollout.engine=vllm``): its offline engine, colocated in the
    trainer's process. Each is passed to ``vllm.LLM`` (or its CPU environment) as named."""

    gpu_memory_utilization: float = setting(
        0.3,
        gt=0,
        le=1,
        why="it is the share of the GPU's memory the engine may take.",
        help=(
            "Share of the device's memory the engine takes for its weights and KV cache (on a "
            "CPU, vLLM reads it as the share of the machine's memory it reserves, its KV cache "
            "being what the process leaves of it). The trainer shares the device, so it is "
            "well below vLLM's own 0.9 (TRL's colocate default is 0.3)."
        ),
        resume=MAY_CHANGE,
        legacy=0.3,
    )
    enforce_eager: bool = setting(
        False,
        help=(
            "Run the engine without CUDA graphs and torch.compile: slower decoding, a much "
            "faster start (on a CPU 2.5 s instead of 20-30 s) and less memory."
        ),
        resume=MAY_CHANGE,
        legacy=False,
    )
    kv_cache_gib: float | None = setting(
        None,
        gt=0,
        why="the KV cache must hold at least one sequence.",
        help=(
            "KV-cache space in GiB (vLLM's kv_cache_memory_bytes; on a CPU the environment's "
            "VLLM_CPU_KVCACHE_SPACE wins over it). null: the engine sizes it from "
            "rollout.vllm.gpu_memory_utilization."
        ),
        resume=MAY_CHANGE,
        legacy=None,
    )
    max_model_len: int | None = setting(
        None,
        ge=2,
        why="a sequence holds a prompt token and a sampled one.",
        help=(
            "Longest sequence (prompt + completion) the engine holds. null: "
            "rl.max_prompt_length + rl.max_completion_length. Refused above the model's "
            "positions or below what a rollout needs."
        ),
        resume=MAY_CHANGE,
        legacy=None,
    )
    max_lora_rank: int | None = setting(
        None,
        ge=1,
        why="a LoRA has a rank of at least 1.",
        help=(
            "Largest LoRA rank the engine serves (vLLM's max_lora_rank; one of 1, 8, 16, 32, "
            "64, 128, 256, 320, 512). null: the smallest of those that holds model.lora.r. "
            "Read when LoRA weights reach the engine as an adapter (rollout.vllm.lora_sync)."
        ),
        resume=MAY_CHANGE,
        legacy=None,
    )
    lora_sync: str = setting(
        "adapter",
        choices=("adapter", "merged"),
        help=(
            "How a LoRA run's weights reach the engine after each optimizer step: adapter "
            "(the new adapter is loaded as a vLLM LoRA, as ART does; vLLM serves LoRA on "
            "linear layers only, so model.lora.modules_to_save needs merged) or merged (the "
            "adapter's deltas are added to the base weights and those tensors loaded, as TRL "
            "does; any target works, the engine holds full weights)."
        ),
        resume=MAY_CHANGE,
        legacy="adapter",
    )
    sleep: bool | None = setting(
        None,
        help=(
            "Free the engine's memory while the trainer steps (vLLM's sleep mode, level 1: "
            "weights offloaded, KV cache dropped) and wake it to sample. null: on where the "
            "device supports it (CUDA) and rollouts do not overlap training; true on a CPU is "
            "refused."
        ),
        resume=MAY_CHANGE,
        legacy=None,
    )


@dataclass
class RolloutConfig:
    """What generates completions (rollouts, evaluation, ``art-hydra generate``): the
    built-in torch sampler, or an inference engine behind the same interface."""

    engine: str = setting(
        "torch",
        help=(
            "The rollout engine: a name registered with register_rollout_engine "
            "(art_hydra.config.rollout_engines): torch (the built-in sampler, on the policy "
            "itself), vllm (vLLM's offline engine, colocated, its weights synced after every "
            "optimizer step), or one a plugin registers."
        ),
        registry="rollout_engine",
        # Every engine takes the policy's weights at a resume, and the sampling stream is
        # the producer's: a resumed run may move to another engine.
        resume=MAY_CHANGE,
        legacy="torch",
    )
    vllm: VLLMConfig = section(VLLMConfig, help="vLLM's settings (rollout.engine=vllm).")


@dataclass
class SFTConfig:
    """Supervised fine-tuning settings (names as in TRL's SFTConfig)."""

    max_length: int = setting(
        1024,
        ge=1,
        help="Longest training example (prompt plus answer), in tokens; longer ones are refused.",
    )
    completion_only_loss: bool = setting(
        True, help="Compute the loss on answer tokens only, not on the prompt."
    )


@dataclass
class ProducerConfig:
    """The side that turns prompts into packed training inputs and awaits each step's result."""

    shuffle: bool = setting(True, help="Shuffle the task's examples before each pass over them.")
    log_completions: int = setting(
        2,
        ge=0,
        help=(
            "Samples per step saved to completions.jsonl in the run directory, for inspection: "
            "RL, whole groups (prompt, reference answer, each completion's rewards and "
            "advantage); SFT, training rows (prompt and target)."
        ),
        resume=MAY_CHANGE,
    )
    share_prompts: bool = setting(
        True,
        help=(
            "Lay sequences that share a prompt (a group's completions) out behind one copy of "
            "it, each attending to that copy and to itself: the same loss and gradient, with the "
            "prompt computed once per group instead of once per completion. Only where rows pack "
            "(the run log names the layout); false repeats the prompt for every completion."
        ),
        legacy=False,
    )


_TIMEOUT_WHY = (
    "every wait is bounded, so stuck work stops the run with an error naming it instead of "
    "hanging, and a thread wait accepts at most threading.TIMEOUT_MAX seconds."
)


def _timeout(default: float, help: str, **rules: Any) -> Any:
    return setting(
        default, gt=0, le=WAIT_MAX_S, float32=False, why=_TIMEOUT_WHY, help=help, **rules
    )


@dataclass
class QueueConfig:
    """The producer <-> trainer channel; deadlocks on it are detected at once."""

    input_timeout_s: float = _timeout(
        600.0,
        "Seconds the trainer waits for its next input while the producer is in none of its "
        "bounded phases (sampling, scoring, checkpointing each have their own bound).",
        resume=MAY_CHANGE,
    )
    maxsize: int = setting(
        1,
        ge=1,
        help="Inputs that may wait on the queue; 1 keeps training on-policy.",
        resume=MAY_CHANGE,
    )


@dataclass
class TimeoutsConfig:
    """A bound for each kind of work, so stuck work stops the run naming what overran."""

    rollout_s: float = _timeout(
        1800.0,
        "Seconds to sample one generation batch of rollouts (multi-turn: all its turns and "
        "tool calls).",
        resume=MAY_CHANGE,
    )
    reward_s: float = _timeout(
        600.0, "Seconds to score one generation batch with the reward function.", resume=MAY_CHANGE
    )
    step_s: float = _timeout(
        1800.0,
        "Seconds for one optimizer step (the producer's wait for its result).",
        resume=MAY_CHANGE,
    )
    checkpoint_s: float = _timeout(1800.0, "Seconds to write one checkpoint.", resume=MAY_CHANGE)
    tool_s: float = _timeout(
        60.0,
        "Seconds one tool call may take (a call that raises is fed back to the model; one "
        "that never returns stops the run).",
        resume=MAY_CHANGE,
    )


@dataclass
class FSDPConfig:
    """FSDP2's settings (``distributed.strategy=fsdp``), passed to ``fully_shard``."""

    reshard_after_forward: bool = setting(
        True,
        help=(
            "Free each block's gathered weights after its forward and gather them again for "
            "the backward (less memory, one more gather per block); false keeps them to the "
            "backward."
        ),
        legacy=True,
        resume=MAY_CHANGE,
    )
    cpu_offload: bool = setting(
        False,
        help=(
            "Keep the sharded weights, gradients and AdamW moments in CPU memory and step the "
            "optimizer there (a GPU run's device memory for the gathered blocks alone); needs "
            "a GPU to offload from (refused on the CPU)."
        ),
        legacy=False,
        resume=MAY_CHANGE,
    )


@dataclass
class DistributedConfig:
    """Data-parallel training over ranks started by torchrun or a SLURM job (one rank per
    process; trainer.per_device_train_batch_size is per rank)."""

    world_size: int | None = setting(
        None,
        ge=1,
        help=(
            "Ranks the run is planned for; null reads WORLD_SIZE from the launcher (1 without one)."
        ),
        legacy=1,
    )
    backend: DistBackend = setting(
        DistBackend.auto, help="Collective backend.", legacy=DistBackend.auto
    )
    timeout_s: float = _timeout(
        300.0,
        "Seconds a collective waits for the other ranks before the run stops naming them.",
        legacy=300.0,
    )
    strategy: DistStrategy = setting(
        DistStrategy.ddp,
        help=(
            "ddp: a whole copy of weights, gradients and AdamW moments per rank; fsdp: those "
            "sharded over the ranks (FSDP2), for models whose training state fits no one device. "
            "One rank shards nothing (it trains as one process)."
        ),
        legacy=DistStrategy.ddp,
        resume=MAY_CHANGE,
    )
    fsdp: FSDPConfig = section(FSDPConfig, help="Sharding settings (distributed.strategy=fsdp).")


@dataclass
class RewardConfig:
    """The task's reward function, named by `_target_` (the one-reward shorthand of
    ``task.rewards``, which replaces it when not empty)."""

    _target_: str = setting(
        MISSING,
        help=(
            "Dotted path of a @reward function, called as f(prompt=, completion=, answer=) -> "
            "float, or batched as f(prompts, completions, **columns) -> list; replaced by "
            "task.rewards when that is not empty."
        ),
    )


@dataclass
class TaskColumns:
    """Which column of the data plays which role (task.source=dataset); TRL's names by
    default. Every column not used as the prompt or the messages reaches the rewards."""

    prompt: str = setting(
        "prompt",
        nonempty=True,
        help="Column holding the prompt: text, or a list of {role, content} messages.",
        legacy="prompt",
    )
    answer: str | None = setting(
        None,
        help=(
            "Column holding the reference answer (SFT's target, the reward's answer); null "
            "takes 'completion' (TRL's prompt-completion format), else 'answer', when present."
        ),
        legacy=None,
    )
    messages: str = setting(
        "messages",
        nonempty=True,
        help=(
            "Column holding a whole conversation (used when the prompt column is absent): "
            "the last assistant turn is the answer, the turns before it the prompt."
        ),
        legacy="messages",
    )


@dataclass
class RewardEntry:
    """One reward of ``task.rewards``: a function or a class, its weight in the total, its
    name in the metrics. An entry may carry other keys: the keyword arguments a reward
    class is instantiated with (the pre-flight refuses them for a function, and any its
    constructor does not take). Its limits are checked by the rewards validator (the bound
    walker does not walk into lists)."""

    _target_: str = setting(
        MISSING,
        help=(
            "Dotted path of the reward: per sample f(prompt=, completion=, answer=) -> float, "
            "or batched as TRL calls it, f(prompts, completions, **columns) -> list."
        ),
    )
    weight: float = setting(
        1.0, help="Its share of the total: the weighted sum of the rewards that apply."
    )
    name: str | None = setting(
        None, help="Logged as reward/<name>/mean and /std; null: the function's name."
    )


@dataclass
class TaskConfig:
    """What the model is trained on, and how completions are scored."""

    name: str = setting(MISSING, nonempty=True, help="Short label used in logs and run names.")
    source: TaskSource = setting(
        TaskSource.generated,
        help=(
            "Where examples come from: a generator function, a JSONL file, or a dataset "
            "(files, a folder or a cached hub dataset)."
        ),
    )
    generator: str | None = setting(
        None, help="Dotted path of the @generator function (source=generated)."
    )
    path: str | None = setting(
        None,
        help=(
            'JSONL file with one {"prompt": ..., "answer": ...} object per line (source=jsonl); '
            "a json/jsonl/csv/parquet file, a folder of them, a save_to_disk folder or a hub "
            "dataset id in the local cache (source=dataset)."
        ),
    )
    split: str = setting(
        "train",
        nonempty=True,
        help="Split of the dataset to train on (source=dataset).",
        legacy="train",
    )
    columns: TaskColumns = section(
        TaskColumns, help="Column of the data for each role (source=dataset)."
    )
    system_prompt: str | None = setting(
        None,
        help=(
            "System message put first in every prompt (needs a model with a chat template); "
            "a conversation that has its own system turn keeps it."
        ),
        legacy=None,
    )
    num_examples: int = setting(
        2000,
        ge=1,
        when=("task.source", TaskSource.generated),
        help="Examples drawn from the generator.",
    )
    params: dict[str, Any] = setting(
        factory=dict, help="Keyword arguments passed to the generator."
    )
    reward: RewardConfig = section(
        RewardConfig, help="Reward function (shorthand for one reward; see task.rewards)."
    )
    rewards: list[Any] = setting(
        factory=list,
        legacy=[],
        entries=RewardEntry,
        help=(
            "Rewards as [{_target_: mod.f, weight: 1.0, name: f}, ...]: the total is the "
            "weighted sum of those that apply; not empty, it replaces task.reward. An "
            "entry's other keys are the constructor's arguments of a reward class."
        ),
    )
    allowed_modules: list[str] = setting(
        factory=list,
        help=(
            "Modules whose unmarked functions reward and generator may name (command line only)."
        ),
    )
    environment: dict[str, Any] | None = setting(
        factory=dict,
        legacy={},
        help=(
            "An environment class in TRL's environment_factory shape, {_target_: mod.Env, ...}: "
            "one instance per rollout (the entry's other keys its constructor's arguments), "
            "reset(**row) before it, its public methods with docstrings the tools, an optional "
            "get_reward() a reward. Empty or null: no environment (task.environment=null "
            "removes one a preset set)."
        ),
    )
    tools: list[str] = setting(
        factory=list,
        legacy=[],
        help=(
            "Dotted names of tool functions the model may call (TRL's tools=[...]): the "
            "docstring and type hints give each one's schema."
        ),
    )
    tool_parser: str = setting(
        "auto",
        legacy="auto",
        help=(
            "How tool calls are read from an assistant turn: auto (the tokenizer's own "
            "parse_response where its model has one, else the format its chat template "
            "writes), hermes (<tool_call>{json}</tool_call>, Qwen), llama3_json, mistral, "
            "transformers, or one registered with register_tool_parser."
        ),
    )
    allow_remote_data: bool = setting(
        False,
        help=(
            "Let the run fetch the remote data files (hf://, https://, s3://, any URL) that a "
            "dataset folder's card names in its data_files (source=dataset; command line "
            "only). The pre-flight never fetches: it says what the run will fetch."
        ),
        legacy=False,
    )


@dataclass
class CheckpointConfig:
    """When and where checkpoints are written."""

    every_steps: int = setting(
        50,
        ge=0,
        why="0 saves only at the end.",
        help="Save every N optimizer steps; 0 saves only at the end of the run.",
        resume=MAY_CHANGE,
    )
    keep_last: int = setting(
        2,
        ge=1,
        why="resume needs a checkpoint to load.",
        help="Checkpoints kept on disk (oldest deleted first).",
        resume=MAY_CHANGE,
    )
    dir: str = setting("checkpoints", nonempty=True, help="Folder inside the run directory.")


@dataclass
class LoggingConfig:
    """What a run reports while it trains."""

    every_steps: int = setting(1, ge=1, help="Write metrics every N steps.", resume=MAY_CHANGE)
    tensorboard: bool | None = setting(
        None,
        help=(
            "Write TensorBoard event files: null follows logging.report_to; true or false "
            "adds or drops TensorBoard whatever report_to says."
        ),
        resume=MAY_CHANGE,
    )
    report_to: list[str] = setting(
        factory=lambda: [TENSORBOARD],
        help=(
            f"Trackers the run reports to through their own libraries: {', '.join(LIBRARIES)}, "
            f"or [{NONE}]. Their files go under the run folder's trackers/ "
            "(TensorBoard's under tensorboard/)."
        ),
        resume=MAY_CHANGE,
    )
    project: str | None = setting(
        None,
        help=(
            "Project (W&B, Trackio) or experiment (MLflow) name the run is filed under; "
            "null: art-hydra-<task name>."
        ),
        resume=MAY_CHANGE,
    )
    trackers_dir: str | None = setting(
        None,
        help=(
            "Folder the trackers' local stores go in, laid out as TRL's libraries write "
            "them: <dir>/wandb, <dir>/mlruns, <dir>/trackio ('.': TRL's ./wandb and ./mlruns "
            "in the working folder). A relative dir is taken from the folder art-hydra was "
            "launched in (hydra.runtime.cwd, also with hydra.job.chdir=true); ~ is home. "
            "A resume may change it: a tracker whose run is not in the new store starts a "
            "new run there, with a warning. null: the run folder's trackers/ (a sweep's jobs share "
            "the sweep folder's MLflow store and Trackio database). A library's own "
            "variable (WANDB_DIR, MLFLOW_TRACKING_URI, TRACKIO_DIR) wins over both."
        ),
        resume=MAY_CHANGE,
        legacy=None,
    )
    plot: bool = setting(True, help="Draw the reward curve to a PNG at the end.", resume=MAY_CHANGE)
    progress_bar: str = setting(
        "auto",
        choices=("auto", "on", "off"),
        aliases=(("True", "on"), ("true", "on"), ("False", "off"), ("false", "off")),
        help=(
            "Progress bar: auto (only on a terminal), on or off (YAML's bare on/off/true/false "
            "work)."
        ),
        resume=MAY_CHANGE,
    )
    progress_every_steps: int = setting(
        0,
        ge=0,
        help=(
            "Where no progress bar shows (stdout not a terminal: piped, SLURM), print a plain "
            "progress line every N steps (0: by time only, logging.progress_every_s); the "
            "lines also go to art_hydra.log."
        ),
        resume=MAY_CHANGE,
    )
    progress_every_s: float = setting(
        30.0,
        gt=0,
        help=(
            "Seconds between plain progress lines (whichever of this and "
            "logging.progress_every_steps comes first)."
        ),
        resume=MAY_CHANGE,
    )


@dataclass
class ObjectiveConfig:
    """The one number a job returns to a sweeper that optimises (Optuna, Ax, Nevergrad),
    ranks the sweep summary by and records in result.json."""

    metric: str = setting(
        "auto",
        nonempty=True,
        help=(
            "Logged metric to optimise (a metrics.jsonl key, e.g. reward_mean, loss); auto: "
            "reward_mean under algorithm=rl, loss under algorithm=sft."
        ),
        resume=MAY_CHANGE,
    )
    reduce: ObjectiveReduce = setting(
        ObjectiveReduce.last,
        help="How the metric's last objective.window logged values become one number.",
        resume=MAY_CHANGE,
    )
    window: int = setting(
        1,
        ge=1,
        why="the objective reduces at least the last logged value.",
        help="Logged steps (the last ones) the reduce runs over.",
        resume=MAY_CHANGE,
    )
    direction: ObjectiveDirection = setting(
        ObjectiveDirection.auto,
        help=(
            "Whether larger or smaller is better (the summary's ranking; set an optimising "
            "sweeper's own direction to match, e.g. hydra.sweeper.direction=maximize)."
        ),
        resume=MAY_CHANGE,
    )


@dataclass
class EvalConfig:
    """Evaluation on held-out prompts while training and at the end: greedy (and
    optionally sampled) completions scored by the task's rewards; SFT also reports the
    loss on them. Off by default (``eval.fraction=0`` and no ``eval.path``/``eval.split``)."""

    fraction: float = setting(
        0.0,
        ge=0.0,
        lt=1.0,
        why="some of the task's distinct prompts must stay for training.",
        help=(
            "Share of the task's distinct prompts held out for evaluation (never trained "
            "on; a prompt repeated in the data goes wholly to one side); 0: none."
        ),
        legacy=0.0,
    )
    path: str | None = setting(
        None,
        help=(
            "Evaluate on this data instead of a fraction, read as the task reads its own "
            "(task.source=dataset: files, a folder or a cached hub dataset; otherwise a "
            "JSONL file of prompt/answer lines)."
        ),
        legacy=None,
    )
    split: str | None = setting(
        None,
        help=(
            "Split to evaluate on (task.source=dataset): of eval.path, or of task.path "
            "when eval.path is null (e.g. eval.split=test)."
        ),
        legacy=None,
    )
    every_steps: int = setting(
        0,
        ge=0,
        why="0 evaluates only at the end.",
        help="Evaluate every N optimizer steps, and always at the end; 0: only at the end.",
        resume=MAY_CHANGE,
    )
    max_examples: int | None = setting(
        None,
        ge=1,
        help="Evaluate on at most this many held-out prompts (the first ones); null: all.",
        resume=MAY_CHANGE,
    )
    batch_size: int = setting(
        32, ge=1, help="Prompts generated for at once during evaluation.", resume=MAY_CHANGE
    )
    max_completion_length: int | None = setting(
        None,
        ge=1,
        help="Longest evaluation completion in tokens; null: rl.max_completion_length.",
        resume=MAY_CHANGE,
    )
    num_samples: int = setting(
        0,
        ge=0,
        help=(
            "Sampled completions per prompt besides the greedy one (eval/sampled_reward); "
            "0: greedy only."
        ),
        resume=MAY_CHANGE,
    )
    temperature: float = setting(
        1.0,
        gt=0.0,
        help="Temperature of the sampled completions (rl.top_k and rl.top_p apply too).",
        resume=MAY_CHANGE,
    )
    log_completions: int = setting(
        8,
        ge=0,
        help="Greedy evaluation completions saved to eval_completions.jsonl per evaluation.",
        resume=MAY_CHANGE,
    )


@dataclass
class RunConfig:
    """A whole run: every section plus the run-level switches."""

    model: ModelConfig = section(ModelConfig, help="Model to train.")
    backend: BackendConfig = section(BackendConfig, help="Library that loads and trains it.")
    algorithm: AlgorithmConfig = section(AlgorithmConfig, help="RL or SFT.")
    trainer: TrainerConfig = section(TrainerConfig, help="Optimisation settings.")
    rl: RLConfig = section(
        RLConfig,
        when=("algorithm.name", AlgorithmName.rl),
        help="RL settings (used when algorithm=rl).",
    )
    sft: SFTConfig = section(
        SFTConfig,
        when=("algorithm.name", AlgorithmName.sft),
        help="SFT settings (used when algorithm=sft).",
    )
    rollout: RolloutConfig = section(
        RolloutConfig, help="What generates completions: the torch sampler or an engine."
    )
    producer: ProducerConfig = section(ProducerConfig, help="Rollout producer.")
    queue: QueueConfig = section(QueueConfig, help="Producer <-> trainer queue.")
    timeouts: TimeoutsConfig = section(
        TimeoutsConfig, help="Bounds on rollouts, rewards, optimizer steps and checkpoint writes."
    )
    distributed: DistributedConfig = section(
        DistributedConfig, help="Data-parallel training over several processes."
    )
    task: TaskConfig = section(TaskConfig, help="Training data and reward.")
    checkpoint: CheckpointConfig = section(CheckpointConfig, help="Checkpointing.")
    logging: LoggingConfig = section(LoggingConfig, help="Metrics, TensorBoard and plots.")
    objective: ObjectiveConfig = section(
        ObjectiveConfig, help="The number a job returns to a sweeper and its summary ranks by."
    )
    eval: EvalConfig = section(EvalConfig, help="Evaluation on held-out prompts (off by default).")
    seed: int = setting(
        42,
        ge=-(2**63),
        le=2**64 - 1,
        why="torch seeds with a 64-bit integer.",
        help="Seed for model init, sampling and data order.",
    )
    dry_run: bool = setting(
        False,
        help="Validate and print the resolved config, then exit without training.",
        resume=MAY_CHANGE,
    )
    resume: str = setting(
        "false",
        choices=("false", "true", "auto"),
        aliases=(("False", "false"), ("True", "true")),
        help=(
            "false: start a fresh run (refused where the folder holds one); true: continue "
            "from the last complete checkpoint in the run directory; auto: continue a run "
            "that has a checkpoint, start one where there is none, skip a finished one "
            "(continues a sweep)."
        ),
        resume=MAY_CHANGE,
    )
    strict: bool = setting(
        False,
        help="Treat warnings as errors: refuse a configuration that only looks like a mistake.",
        resume=MAY_CHANGE,
    )
