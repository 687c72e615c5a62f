"""TRL's names lead to art_hydra's keys: a user who types ``save_steps``, ``bf16`` or
``reward_funcs`` is told the key that does that work here (not a spelling match such as
``trainer.max_steps``), and the fix composes as given."""

from __future__ import annotations

import pytest
from conftest import problem_about

from art_hydra import compose
from art_hydra.config.problems import ConfigValidationError, Fix
from art_hydra.config.trl_names import TRL_NAMES

#: A value TRL would take for each name, valid for art_hydra's key too.
VALUES: dict[str, str] = {
    "save_steps": "10",
    "save_total_limit": "2",
    "logging_steps": "5",
    "eval_steps": "5",
    "bf16": "true",
    "fp16": "false",
    "reward_funcs": "[art_hydra.tasks.rewards.exact_match,art_hydra.tasks.rewards.char_overlap]",
    "reward_weights": "[1.0,0.5]",
    "num_train_epochs": "3",
    "warmup_ratio": "0.1",
    "loss_type": "dr_grpo",
    "output_dir": "my_run",
    "model_name_or_path": "tiny-llama",
    "gradient_checkpointing": "true",
    "report_to": "[tensorboard]",
    "max_length": "64",
    "completion_only_loss": "false",
    "resume_from_checkpoint": "true",
    "num_generations": "4",
    "max_prompt_length": "32",
    "max_completion_length": "16",
    "temperature": "0.9",
    "top_p": "0.95",
    "top_k": "20",
    "beta": "0.04",
    "epsilon": "0.2",
    "epsilon_high": "0.28",
    "num_iterations": "1",
    "steps_per_generation": "1",
    "scale_rewards": "false",
    "learning_rate": "1e-05",
    "per_device_train_batch_size": "16",
    "gradient_accumulation_steps": "1",
    "max_steps": "7",
    "max_grad_norm": "0.5",
    "weight_decay": "0.01",
    "warmup_steps": "2",
    "lr_scheduler_type": "cosine",
    "adam_beta1": "0.9",
    "adam_beta2": "0.99",
    "adam_epsilon": "1e-08",
}

#: What the fix needs beside it to compose: weights weigh rewards the run has.
CONTEXT: dict[str, list[str]] = {
    "reward_weights": [
        "task.rewards=[{_target_:art_hydra.tasks.rewards.exact_match},"
        "{_target_:art_hydra.tasks.rewards.char_overlap}]"
    ],
}


def test_every_name_has_a_value_here() -> None:
    assert set(VALUES) == set(TRL_NAMES)


def _typed_at(name: str) -> str:
    """Where a TRL user would type the name: under trainer (TRL has one flat config),
    or at the top level for the names that are trainer keys here."""
    key = TRL_NAMES[name].key
    return name if key.startswith("trainer.") else f"trainer.{name}"


@pytest.mark.parametrize("name", sorted(TRL_NAMES))
def test_a_trl_name_leads_to_the_key_that_does_its_work(name: str) -> None:
    path = _typed_at(name)
    with pytest.raises(ConfigValidationError) as info:
        compose([f"+{path}={VALUES[name]}"])
    problem = problem_about(info.value.problems, path)
    assert f"{name} is TRL's name; art_hydra's is {TRL_NAMES[name].key}" in problem.reason
    found = problem.fix
    assert isinstance(found, Fix) and found.drops == (path,)
    keys = [key for key, _ in found.sets]
    # TRL's loss_type names a policy loss and a normalisation: two keys here.
    also = {"loss_type": ("rl.loss_aggregation",)}.get(name, ())
    assert keys and all(k.startswith(TRL_NAMES[name].key) or k in also for k in keys), keys
    if found.has_placeholder:  # art_hydra has no such setting: the note says so
        assert found.note
        return
    compose([*CONTEXT.get(name, []), *found.overrides()])  # pasteable: it composes


def test_a_spelling_match_no_longer_hides_trls_meaning() -> None:
    """``save_steps`` is one edit from ``max_steps``; it means the checkpoint interval."""
    with pytest.raises(ConfigValidationError) as info:
        compose(["+trainer.save_steps=10"])
    problem = problem_about(info.value.problems, "trainer.save_steps")
    assert isinstance(problem.fix, Fix)
    assert problem.fix.overrides() == ["checkpoint.every_steps=10"]


@pytest.mark.parametrize("name", ["vespo", "luspo"])
def test_a_trl_loss_type_with_no_equivalent_here_gets_none_made_up(name: str) -> None:
    """A newer TRL's loss_type is not passed off as ppo_clip with dapo's normalisation."""
    with pytest.raises(ConfigValidationError) as info:
        compose([f"+loss_type={name}"])
    found = problem_about(info.value.problems, "loss_type").fix
    assert isinstance(found, Fix) and found.has_placeholder
    assert [key for key, _ in found.sets] == ["rl.loss_type"]
    assert f"loss_type={name} has no equivalent here" in found.note


def test_trls_num_train_epochs_fix_sizes_the_run_by_epochs() -> None:
    """The fix for a top-level num_train_epochs=2 trains 2 epochs, though the tiny model's
    settings set trainer.max_steps=300: the epochs are typed, the file's steps are not."""
    with pytest.raises(ConfigValidationError) as info:
        compose(["+num_train_epochs=2"])
    found = problem_about(info.value.problems, "num_train_epochs").fix
    assert found.overrides() == ["trainer.num_train_epochs=2"]
    cfg = compose(found.overrides())
    assert cfg.trainer.max_steps is None and cfg.trainer.num_train_epochs == 2
