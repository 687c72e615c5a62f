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
        note = self.note
        if self.key == "rl.loss_type":
            note = unknown_loss_type_note(value) or note
        return fix(sets, note=note, drops=(path,))


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


#: TRL 1.16's ``GRPOConfig.loss_type`` names one policy loss and one normalisation
#: together; art_hydra keeps them apart: name -> (``rl.loss_type``,
#: ``rl.loss_aggregation``, what differs). TRL's cispo normalises as dapo does; its sapo
#: (a soft gate) as grpo does, with no such policy loss here.
TRL_LOSS_TYPES: dict[str, tuple[str, str, str]] = {
    "grpo": ("ppo_clip", "grpo", ""),
    "bnpo": ("ppo_clip", "bnpo", ""),
    "dr_grpo": ("ppo_clip", "dr_grpo", ""),
    "dapo": ("ppo_clip", "dapo", ""),
    "cispo": ("cispo", "dapo", ""),
    "sapo": (
        "ppo_clip",
        "grpo",
        "art_hydra has no SAPO soft gate: ppo_clip (its hard clip) with SAPO's grpo "
        "normalisation is the closest; a 'sapo' loss registered with @register_policy_loss "
        "would be taken as named",
    ),
}


def _loss_type(value: Any) -> Mapping[str, Any]:
    """TRL's ``loss_type`` as the two keys here; a name outside :data:`TRL_LOSS_TYPES`
    (a newer TRL's vespo, luspo) has no equivalent here, and none is made up: the fix
    asks for a policy loss (:func:`unknown_loss_type_note` says why)."""
    found = TRL_LOSS_TYPES.get(str(value))
    if found is None:
        return {"rl.loss_type": placeholder("a registered policy loss: ppo_clip, cispo")}
    loss, aggregation, _ = found
    return {"rl.loss_type": loss, "rl.loss_aggregation": aggregation}


def unknown_loss_type_note(value: Any) -> str | None:
    """What the fix says of a TRL ``loss_type`` with no equivalent here (None: it has one)."""
    if str(value) in TRL_LOSS_TYPES:
        return None
    return (
        f"TRL's loss_type={value} has no equivalent here: art_hydra's policy losses are "
        "ppo_clip (TRL's grpo, bnpo, dr_grpo, dapo) and cispo, and a new one is registered "
        "with @register_policy_loss"
    )


def trl_loss_type_fix(value: Any) -> tuple[str, Fix] | None:
    """(why, fix) where ``rl.loss_type`` holds one of TRL's ``loss_type`` names that is no
    policy loss here (``dapo``, ``grpo``, ...): a TRL user chose a normalisation, which
    is ``rl.loss_aggregation`` here, so the fix sets both keys, not ppo_clip alone."""
    found = TRL_LOSS_TYPES.get(str(value))
    if found is None:
        return None
    loss, aggregation, note = found
    policy = "SAPO's soft gate" if note else f"{loss}, PPO's clipped surrogate,"
    why = (
        f"is TRL's loss_type for {policy} with the {aggregation} normalisation; art_hydra "
        "keeps the policy loss (rl.loss_type: a registered policy loss) and how its token "
        "terms are averaged (rl.loss_aggregation: dapo, grpo, bnpo, dr_grpo) apart."
    )
    sets = {"rl.loss_type": loss, "rl.loss_aggregation": aggregation}
    return why, fix(sets, note=note)


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
        "trainer.num_train_epochs",
        note="typed, it sizes the run from the data, setting aside a trainer.max_steps from "
        "a config file; a trainer.max_steps typed with it wins, as in TRL",
    ),
    "warmup_ratio": TrlName(
        "trainer.warmup_steps",
        note="art_hydra warms up for a number of steps, not a fraction of the run",
        convert=_asked("trainer.warmup_steps", "steps"),
    ),
    "loss_type": TrlName(
        "rl.loss_type",
        note="TRL's loss_type names a policy loss and a normalisation at once; here they "
        "are rl.loss_type (ppo_clip, TRL's clipped surrogate, or cispo) and "
        "rl.loss_aggregation (grpo, bnpo, dr_grpo, dapo)",
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
