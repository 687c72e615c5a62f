"""TRL's names for settings art_hydra keeps under keys of its own.

People arrive with a ``GRPOConfig``/``SFTConfig`` (and ``TrainingArguments``) in mind and
type its names: ``trainer.save_steps=10``, ``+bf16=true``, ``+reward_funcs=[...]``. A
spelling match would send ``save_steps`` to ``trainer.max_steps``; this table sends each
name to the key that does the same work here, with its value converted, and says so
where art_hydra has no such setting, naming the closest. Plain Python, on the compose
path (:func:`art_hydra.config.structure.unknown_key_problem` asks it first).
"""

from __future__ import annotations

from collections.abc import Callable, Mapping
from dataclasses import dataclass
from typing import Any

from art_hydra.config.problems import Fix, fix, placeholder


def _truthy(value: Any) -> bool:
    return value is True or str(value).strip().lower() in {"true", "1", "yes"}


@dataclass(frozen=True)
class TrlName:
    """Where one of TRL's names leads: ``key``, set to the value as typed, or to what
    ``convert`` makes of it; ``note`` says what differs."""

    key: str
    note: str = ""
    convert: Callable[[Any], Mapping[str, Any]] | None = None

    def suggestion(self, path: str, value: Any) -> Fix:
        sets = self.convert(value) if self.convert is not None else {self.key: value}
        return fix(sets, note=self.note, drops=(path,))


def _dtype(half: str) -> Callable[[Any], Mapping[str, Any]]:
    def convert(value: Any) -> Mapping[str, Any]:
        return {"model.dtype": half if _truthy(value) else "float32"}

    return convert


def _targets(value: Any) -> Mapping[str, Any]:
    names = value if isinstance(value, (list, tuple)) else [value]
    return {"task.rewards": [{"_target_": str(n)} for n in names]}


def _weights(value: Any) -> Mapping[str, Any]:
    weights = value if isinstance(value, (list, tuple)) else [value]
    return {f"task.rewards.{i}.weight": w for i, w in enumerate(weights)}


def _loss_type(value: Any) -> Mapping[str, Any]:
    return {"rl.loss_type": "cispo" if str(value) == "cispo" else "ppo_clip"}


def _asked(key: str, what: str) -> Callable[[Any], Mapping[str, Any]]:
    """No setting of TRL's kind here: the closest key, its value the user's to choose."""

    def convert(value: Any) -> Mapping[str, Any]:
        return {key: placeholder(what)}

    return convert


#: TRL's (and TrainingArguments') name -> where it leads here.
TRL_NAMES: dict[str, TrlName] = {
    "save_steps": TrlName("checkpoint.every_steps"),
    "save_total_limit": TrlName("checkpoint.keep_last"),
    "logging_steps": TrlName("logging.every_steps"),
    "eval_steps": TrlName("eval.every_steps"),
    "bf16": TrlName("model.dtype", convert=_dtype("bfloat16")),
    "fp16": TrlName("model.dtype", convert=_dtype("float16")),
    "reward_funcs": TrlName("task.rewards", convert=_targets),
    "reward_weights": TrlName(
        "task.rewards",
        note="each entry of task.rewards carries its own weight",
        convert=_weights,
    ),
    "num_train_epochs": TrlName(
        "trainer.max_steps",
        note="art_hydra counts optimizer steps, not epochs: an epoch is the examples "
        "divided by the prompts of one step",
        convert=_asked("trainer.max_steps", "optimizer steps"),
    ),
    "warmup_ratio": TrlName(
        "trainer.warmup_steps",
        note="art_hydra warms up for a number of steps, not a fraction of the run",
        convert=_asked("trainer.warmup_steps", "steps"),
    ),
    "loss_type": TrlName(
        "rl.loss_type",
        note="art_hydra has ppo_clip, TRL's clipped surrogate, which grpo, bnpo, dr_grpo "
        "and dapo share while averaging tokens each their own way; and cispo",
        convert=_loss_type,
    ),
    "output_dir": TrlName("hydra.run.dir"),
    "model_name_or_path": TrlName("model.name"),
    "gradient_checkpointing": TrlName("backend.gradient_checkpointing"),
    "report_to": TrlName("logging.report_to"),
    "max_length": TrlName("sft.max_length"),
    "completion_only_loss": TrlName("sft.completion_only_loss"),
    "resume_from_checkpoint": TrlName(
        "resume",
        note="resume=true continues the run in its folder (hydra.run.dir) from its last checkpoint",
        convert=lambda value: {"resume": True},
    ),
    **{
        name: TrlName(f"rl.{name}")
        for name in (
            "num_generations",
            "max_prompt_length",
            "max_completion_length",
            "temperature",
            "top_p",
            "top_k",
            "beta",
            "epsilon",
            "epsilon_high",
            "num_iterations",
            "steps_per_generation",
            "scale_rewards",
        )
    },
    **{
        name: TrlName(f"trainer.{name}")
        for name in (
            "learning_rate",
            "per_device_train_batch_size",
            "gradient_accumulation_steps",
            "max_steps",
            "max_grad_norm",
            "weight_decay",
            "warmup_steps",
            "lr_scheduler_type",
            "adam_beta1",
            "adam_beta2",
            "adam_epsilon",
        )
    },
}


def trl_suggestion(path: str, value: Any) -> tuple[str, Fix] | None:
    """(what to say, the fix) for an unknown key whose last name is TRL's, or None. A
    name already at its own key (``trainer.learning_rate``) is never unknown, so this
    sees only one typed elsewhere (``rl.learning_rate``, ``+learning_rate``)."""
    leaf = path.rpartition(".")[2]
    found = TRL_NAMES.get(leaf)
    if found is None:
        return None
    hint = f" {leaf} is TRL's name; art_hydra's is {found.key}."
    return hint, found.suggestion(path, value)
