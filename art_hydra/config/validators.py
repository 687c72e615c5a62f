"""Built-in validators: configurations that cannot work, rejected when composed.

Each validator reads a few keys of the composed config and yields a
:class:`Problem` naming the key, the value, why the run cannot work and the override
that fixes it. They run on every config that comes into being (CLI run, every sweep
point, every job, the compose API, ``train(cfg)``), so they must be cheap and must not
import anything heavy.
"""

from __future__ import annotations

import math
import os
import re
from collections.abc import Iterator

from omegaconf import DictConfig, OmegaConf

from art_hydra.config.problems import Problem
from art_hydra.config.registry import validator
from art_hydra.config.schema import (
    AlgorithmName,
    BackendName,
    Device,
    FinetuneMethod,
    LossType,
    ModelSource,
    TaskSource,
)

_DOTTED_PATH = re.compile(r"^[A-Za-z_]\w*(\.[A-Za-z_]\w*)+$")


def _is_rl(cfg: DictConfig) -> bool:
    return cfg.algorithm.name == AlgorithmName.rl


def _divisors(n: int) -> list[int]:
    return [d for d in range(1, n + 1) if n % d == 0]


#: Reason given for NaN and infinite numbers (other validators' findings on such a key
#: are dropped as noise).
NOT_FINITE = "must be a finite number"


@validator
def numbers_are_finite(cfg: DictConfig) -> Iterator[Problem]:
    """NaN or infinity slips past every `x > 0` check, so catch it first, anywhere."""
    for section in cfg:
        if section == "hydra":
            continue
        yield from _non_finite(cfg[section], str(section))


def _non_finite(node: object, path: str) -> Iterator[Problem]:
    if isinstance(node, DictConfig):
        for key in node:
            if not OmegaConf.is_missing(node, key) and not OmegaConf.is_interpolation(node, key):
                yield from _non_finite(node[key], f"{path}.{key}")
    elif isinstance(node, float) and not math.isfinite(node):
        yield Problem(
            path, node, f"{NOT_FINITE}: NaN or infinity cannot train.", f"{path}=<a finite number>"
        )


@validator
def names_are_not_empty(cfg: DictConfig) -> Iterator[Problem]:
    for key, hint in (("model.name", "Qwen/Qwen2.5-0.5B-Instruct"), ("task.name", "my_task")):
        value = OmegaConf.select(cfg, key)
        if isinstance(value, str) and not value.strip():
            yield Problem(key, value, "must not be empty.", f"{key}={hint}")


@validator
def rl_rejects_gradient_accumulation(cfg: DictConfig) -> Iterator[Problem]:
    """The founding rule: RL with accumulation deadlocks producer and trainer."""
    gas = cfg.trainer.gradient_accumulation_steps
    if not _is_rl(cfg) or gas <= 1:
        return
    batch = max(cfg.trainer.per_device_train_batch_size, 1)
    n = cfg.rl.num_generations
    total = batch * gas
    groups = f", {total // n} groups of rl.num_generations={n}" if n > 0 and total % n == 0 else ""
    yield Problem(
        key="trainer.gradient_accumulation_steps",
        value=gas,
        reason=(
            "RL cannot accumulate gradients: the producer puts one packed input on the queue and "
            "waits for that input's optimizer-step result before it makes the next one, while "
            f"the trainer would wait for {gas - 1} more input(s) before stepping. Both sides would "
            "wait on each other forever (the run hangs at step 0)."
        ),
        fix=(
            f"trainer.gradient_accumulation_steps=1 trainer.per_device_train_batch_size={total} "
            f"(the same {total} completions per optimizer step{groups})"
        ),
    )


@validator
def accumulation_is_positive(cfg: DictConfig) -> Iterator[Problem]:
    gas = cfg.trainer.gradient_accumulation_steps
    if gas < 1:
        yield Problem(
            "trainer.gradient_accumulation_steps",
            gas,
            "must be at least 1: it counts the micro-batches that make one optimizer step.",
            "trainer.gradient_accumulation_steps=1",
        )


@validator
def positive_training_numbers(cfg: DictConfig) -> Iterator[Problem]:
    t = cfg.trainer
    if not t.learning_rate > 0:
        yield Problem(
            "trainer.learning_rate",
            t.learning_rate,
            "must be > 0: with a zero or negative learning rate the weights never improve "
            "(or move uphill).",
            "trainer.learning_rate=1e-5",
        )
    if t.max_steps < 1:
        yield Problem(
            "trainer.max_steps",
            t.max_steps,
            "must be at least 1 optimizer step.",
            "trainer.max_steps=100",
        )
    if t.per_device_train_batch_size < 1:
        yield Problem(
            "trainer.per_device_train_batch_size",
            t.per_device_train_batch_size,
            "must be at least 1 sequence per step.",
            "trainer.per_device_train_batch_size=8",
        )
    if t.max_grad_norm < 0:
        yield Problem(
            "trainer.max_grad_norm",
            t.max_grad_norm,
            "must be >= 0 (0 disables clipping); a negative norm cannot be clipped to.",
            "trainer.max_grad_norm=1.0",
        )
    if t.weight_decay < 0:
        yield Problem(
            "trainer.weight_decay",
            t.weight_decay,
            "must be >= 0: negative decay pushes weights away from zero without bound.",
            "trainer.weight_decay=0.0",
        )
    if t.warmup_steps < 0:
        yield Problem(
            "trainer.warmup_steps", t.warmup_steps, "must be >= 0.", "trainer.warmup_steps=0"
        )
    elif t.max_steps >= 1 and t.warmup_steps >= t.max_steps:
        yield Problem(
            "trainer.warmup_steps",
            t.warmup_steps,
            f"is not shorter than the run (trainer.max_steps={t.max_steps}): the learning rate "
            "would never reach trainer.learning_rate.",
            f"trainer.warmup_steps={t.max_steps // 10}",
        )
    for key in ("adam_beta1", "adam_beta2"):
        beta = t[key]
        if not 0 <= beta < 1:
            yield Problem(
                f"trainer.{key}",
                beta,
                "must lie in [0, 1): it is the decay rate of a running average.",
                f"trainer.{key}={0.9 if key == 'adam_beta1' else 0.999}",
            )
    if not t.adam_epsilon > 0:
        yield Problem(
            "trainer.adam_epsilon",
            t.adam_epsilon,
            "must be > 0: AdamW divides by sqrt(v) + epsilon.",
            "trainer.adam_epsilon=1e-8",
        )


@validator
def rl_groups_fill_the_batch(cfg: DictConfig) -> Iterator[Problem]:
    """Completions per step must split into whole groups of num_generations."""
    if not _is_rl(cfg):
        return
    n = cfg.rl.num_generations
    batch = cfg.trainer.per_device_train_batch_size
    if n < 2:
        options = [d for d in _divisors(batch) if d >= 2] if batch >= 2 else []
        suggestion = (
            f"rl.num_generations={options[0]}"
            if options
            else ("rl.num_generations=8 trainer.per_device_train_batch_size=8")
        )
        yield Problem(
            "rl.num_generations",
            n,
            "must be at least 2: advantages are rewards normalised within a group of "
            "completions of the same prompt, and a group of one always has advantage 0, so "
            "nothing would be learned.",
            suggestion,
        )
        return
    if batch >= 1 and batch % n != 0:
        up = math.ceil(batch / n) * n
        divisors = [d for d in _divisors(batch) if d >= 2]
        alt = f" or rl.num_generations={divisors[-1]}" if divisors else ""
        yield Problem(
            "trainer.per_device_train_batch_size",
            batch,
            f"is not a multiple of rl.num_generations={n}: each optimizer step trains on whole "
            f"groups of {n} completions of one prompt, and {batch} completions do not split "
            "into whole groups.",
            f"trainer.per_device_train_batch_size={up} ({up // n} groups){alt}",
        )


@validator
def rl_sampling_and_clipping(cfg: DictConfig) -> Iterator[Problem]:
    if not _is_rl(cfg):
        return
    rl = cfg.rl
    if not 0 < rl.epsilon < 1:
        yield Problem(
            "rl.epsilon",
            rl.epsilon,
            "must lie in (0, 1): the ratio is clipped below at 1 - epsilon, which must stay "
            "positive, and epsilon 0 clips every update away.",
            "rl.epsilon=0.2",
        )
    if rl.epsilon_high is not None and not rl.epsilon_high > 0:
        yield Problem(
            "rl.epsilon_high",
            rl.epsilon_high,
            "must be > 0 (or null to use rl.epsilon): the ratio is clipped above at "
            "1 + epsilon_high.",
            "rl.epsilon_high=0.28" if rl.loss_type == LossType.ppo_clip else "rl.epsilon_high=5.0",
        )
    if not rl.temperature > 0:
        yield Problem(
            "rl.temperature",
            rl.temperature,
            "must be > 0: logits are divided by the temperature, and GRPO needs sampled, "
            "differing completions in each group.",
            "rl.temperature=1.0",
        )
    if not 0 < rl.top_p <= 1:
        yield Problem("rl.top_p", rl.top_p, "must lie in (0, 1].", "rl.top_p=1.0")
    if rl.top_k < 0:
        yield Problem("rl.top_k", rl.top_k, "must be >= 0 (0 disables top-k).", "rl.top_k=0")
    if rl.beta < 0:
        yield Problem(
            "rl.beta",
            rl.beta,
            "must be >= 0: a negative KL weight rewards drifting away from the reference.",
            "rl.beta=0.0",
        )
    if rl.max_prompt_length < 1:
        yield Problem(
            "rl.max_prompt_length",
            rl.max_prompt_length,
            "must be at least 1 token.",
            "rl.max_prompt_length=256",
        )
    if rl.max_completion_length < 1:
        yield Problem(
            "rl.max_completion_length",
            rl.max_completion_length,
            "must be at least 1 token: there would be nothing to reward.",
            "rl.max_completion_length=256",
        )


@validator
def sequences_fit_the_model(cfg: DictConfig) -> Iterator[Problem]:
    limit = cfg.model.max_seq_length
    if limit < 1:
        yield Problem(
            "model.max_seq_length", limit, "must be at least 1 token.", "model.max_seq_length=1024"
        )
        return
    if _is_rl(cfg):
        prompt, completion = cfg.rl.max_prompt_length, cfg.rl.max_completion_length
        if prompt >= 1 and completion >= 1 and prompt + completion > limit:
            yield Problem(
                "rl.max_completion_length",
                completion,
                f"rl.max_prompt_length={prompt} plus rl.max_completion_length={completion} is "
                f"{prompt + completion} tokens, longer than model.max_seq_length={limit}: "
                "rollouts would be cut or overflow the model's positions.",
                f"model.max_seq_length={prompt + completion}"
                + (
                    f" or rl.max_completion_length={limit - prompt}"
                    if limit - prompt >= 1
                    else f" or rl.max_prompt_length={limit // 2} "
                    f"rl.max_completion_length={limit - limit // 2}"
                    if limit >= 2
                    else ""
                ),
            )
    elif cfg.sft.max_length > limit:
        yield Problem(
            "sft.max_length",
            cfg.sft.max_length,
            f"is longer than model.max_seq_length={limit}: examples would overflow the model's "
            "positions.",
            f"sft.max_length={limit} or model.max_seq_length={cfg.sft.max_length}",
        )
    elif cfg.sft.max_length < 1:
        yield Problem(
            "sft.max_length",
            cfg.sft.max_length,
            "must be at least 1 token.",
            f"sft.max_length={limit}",
        )


@validator
def model_and_backend_agree(cfg: DictConfig) -> Iterator[Problem]:
    model, backend = cfg.model, cfg.backend
    if model.load_in_4bit:
        if backend.name != BackendName.unsloth:
            yield Problem(
                "model.load_in_4bit",
                True,
                f"backend={backend.name.name} loads weights in full or half precision; 4-bit "
                "loading needs the Unsloth backend (bitsandbytes kernels on a CUDA GPU).",
                "backend=unsloth, or model.load_in_4bit=false",
            )
        if model.source == ModelSource.tiny:
            yield Problem(
                "model.load_in_4bit",
                True,
                "the tiny model is built locally in full precision and cannot be loaded in 4 bits.",
                "model.load_in_4bit=false",
            )
        if model.finetune == FinetuneMethod.full:
            yield Problem(
                "model.load_in_4bit",
                True,
                "4-bit weights are frozen; full fine-tuning needs trainable full-precision "
                "weights.",
                "model.finetune=lora, or model.load_in_4bit=false",
            )
    if backend.name == BackendName.unsloth and backend.device == Device.cpu:
        yield Problem(
            "backend.device",
            "cpu",
            "the Unsloth backend runs only on a CUDA GPU.",
            "backend=torch (runs on the CPU), or backend.device=cuda",
        )


@validator
def adapter_settings(cfg: DictConfig) -> Iterator[Problem]:
    if cfg.model.finetune != FinetuneMethod.lora:
        return
    lora = cfg.model.lora
    if lora.r < 1:
        yield Problem(
            "model.lora.r", lora.r, "the LoRA rank must be at least 1.", "model.lora.r=16"
        )
    if not lora.alpha > 0:
        yield Problem(
            "model.lora.alpha",
            lora.alpha,
            "must be > 0: the adapter update is scaled by alpha / r.",
            f"model.lora.alpha={2 * max(lora.r, 1)}",
        )
    if not 0 <= lora.dropout < 1:
        yield Problem(
            "model.lora.dropout", lora.dropout, "must lie in [0, 1).", "model.lora.dropout=0.0"
        )
    if len(lora.target_modules) == 0 and len(lora.modules_to_save) == 0:
        yield Problem(
            "model.lora.target_modules",
            [],
            "no module gets an adapter and none is trained in full, so nothing would train.",
            "model.lora.target_modules=[q_proj,k_proj,v_proj,o_proj], or model.finetune=full",
        )


@validator
def tiny_model_shape(cfg: DictConfig) -> Iterator[Problem]:
    if cfg.model.source != ModelSource.tiny:
        return
    tiny = cfg.model.tiny
    for key in ("hidden_size", "num_layers", "num_heads", "intermediate_size"):
        if tiny[key] < 1:
            yield Problem(
                f"model.tiny.{key}",
                tiny[key],
                "must be at least 1.",
                f"model.tiny.{key}=<a positive integer>",
            )
    if not tiny.init_std > 0:
        yield Problem(
            "model.tiny.init_std", tiny.init_std, "must be > 0.", "model.tiny.init_std=0.02"
        )
    if tiny.hidden_size >= 1 and tiny.num_heads >= 1:
        head_dim, rest = divmod(tiny.hidden_size, tiny.num_heads)
        heads = [h for h in _divisors(tiny.hidden_size) if (tiny.hidden_size // h) % 2 == 0]
        if rest or head_dim % 2:
            fix = (
                f"model.tiny.num_heads={heads[-1]}"
                if heads
                else f"model.tiny.hidden_size={tiny.hidden_size + 1} model.tiny.num_heads=1"
            )
            yield Problem(
                "model.tiny.num_heads",
                tiny.num_heads,
                f"must divide model.tiny.hidden_size={tiny.hidden_size} into heads of even size "
                "(rotary position embeddings rotate pairs of dimensions).",
                fix,
            )


@validator
def task_data_is_reachable(cfg: DictConfig) -> Iterator[Problem]:
    task = cfg.task
    if task.source == TaskSource.jsonl:
        path = task.path
        if path is None:
            yield Problem(
                "task.path",
                None,
                "task.source=jsonl needs the JSONL file to read.",
                "task.path=/path/to/data.jsonl",
            )
        elif not os.path.isfile(os.path.expanduser(path)):
            where = "" if os.path.isabs(path) else f" (relative to {os.getcwd()})"
            yield Problem(
                "task.path", path, f"no such file{where}.", "task.path=/absolute/path/to/data.jsonl"
            )
    elif task.generator is None or not _DOTTED_PATH.match(task.generator):
        yield Problem(
            "task.generator",
            task.generator,
            "task.source=generated needs the dotted path of an example generator.",
            "task=reverse, or task.generator=my_pkg.my_module.my_examples",
        )
    if task.source == TaskSource.generated and task.num_examples < 1:
        yield Problem(
            "task.num_examples", task.num_examples, "must be at least 1.", "task.num_examples=2000"
        )
    target = task.reward._target_
    if not _DOTTED_PATH.match(target):
        yield Problem(
            "task.reward._target_",
            target,
            "must be the dotted path of a reward function (module.function).",
            "task.reward._target_=art_hydra.tasks.rewards.exact_match",
        )


@validator
def checkpoints_happen(cfg: DictConfig) -> Iterator[Problem]:
    ckpt, max_steps = cfg.checkpoint, cfg.trainer.max_steps
    if ckpt.every_steps < 0:
        yield Problem(
            "checkpoint.every_steps",
            ckpt.every_steps,
            "must be >= 0 (0 saves only at the end).",
            "checkpoint.every_steps=0",
        )
    elif max_steps >= 1 and ckpt.every_steps > max_steps:
        yield Problem(
            "checkpoint.every_steps",
            ckpt.every_steps,
            f"is larger than the run (trainer.max_steps={max_steps}), so no intermediate "
            "checkpoint would ever be written and an interrupted run could not resume.",
            f"checkpoint.every_steps={max_steps}, or checkpoint.every_steps=0 to save only at "
            "the end",
        )
    if ckpt.keep_last < 1:
        yield Problem(
            "checkpoint.keep_last",
            ckpt.keep_last,
            "must keep at least 1 checkpoint, or resume has nothing to load.",
            "checkpoint.keep_last=2",
        )
    if not str(ckpt.dir).strip():
        yield Problem(
            "checkpoint.dir", ckpt.dir, "must name a folder.", "checkpoint.dir=checkpoints"
        )


@validator
def queue_waits_are_bounded(cfg: DictConfig) -> Iterator[Problem]:
    q = cfg.queue
    for key in ("result_timeout_s", "input_timeout_s"):
        if not q[key] > 0:
            yield Problem(
                f"queue.{key}",
                q[key],
                "must be a finite number of seconds > 0: every wait on the queue is bounded, so "
                "a stalled side raises an error instead of hanging.",
                f"queue.{key}=600",
            )
    if q.maxsize < 1:
        yield Problem("queue.maxsize", q.maxsize, "must hold at least 1 input.", "queue.maxsize=1")


@validator
def logging_cadence(cfg: DictConfig) -> Iterator[Problem]:
    if cfg.logging.every_steps < 1:
        yield Problem(
            "logging.every_steps",
            cfg.logging.every_steps,
            "must be at least 1.",
            "logging.every_steps=1",
        )
    if cfg.producer.log_completions < 0:
        yield Problem(
            "producer.log_completions",
            cfg.producer.log_completions,
            "must be >= 0.",
            "producer.log_completions=2",
        )
