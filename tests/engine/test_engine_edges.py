"""Engine cases found in review: masked -inf, chat templates, long prompts, stop ids,
changed settings on resume."""

from __future__ import annotations

import json
import math
from pathlib import Path

import pytest
import torch
from conftest_model import QUICK, tiny

from art_hydra import ConfigValidationError, compose, train
from art_hydra.engine.metrics import read_metrics
from art_hydra.engine.producer import RLProducer, encode_checked, encode_prompt, stop_token_ids
from art_hydra.engine.rl.losses import PolicyLossSettings, policy_loss
from art_hydra.engine.rl.sampling import SamplingSettings
from art_hydra.tasks import Example

#: These tests train the tiny model.
pytestmark = pytest.mark.slow


def test_masked_positions_with_minus_inf_add_exactly_zero() -> None:
    logp = torch.tensor([float("-inf"), -0.5])  # a suppressed pad target, then a real token
    mask = torch.tensor([0.0, 1.0])
    for loss_type in ("cispo", "ppo_clip"):
        settings = PolicyLossSettings(loss_type, 0.2, 0.28, beta=0.1)
        loss, stats = policy_loss(
            logp,
            torch.tensor([float("-inf"), -0.5]),
            torch.tensor([3.0, 1.0]),
            mask,
            settings,
            1.0,
            ref_logprobs=torch.tensor([float("-inf"), -0.5]),
        )
        assert math.isfinite(loss.item()) and math.isfinite(stats["kl"])


@pytest.mark.parametrize(
    "extra",
    [
        ["rl.loss_type=cispo", "rl.epsilon_high=5.0"],
        ["rl.beta=0.04"],
        ["rl.beta=0.04", "model.finetune=lora", "model.lora.r=4"],
    ],
)
def test_cispo_and_kl_runs_train(tmp_path: Path, extra: list[str]) -> None:
    summary = train(compose([*QUICK, "trainer.max_steps=2", *extra]), run_dir=tmp_path)
    metrics = read_metrics(tmp_path)
    assert summary["steps"] == 2 and all(math.isfinite(m["loss"]) for m in metrics)
    if "rl.beta=0.04" in extra:
        assert all(m["kl"] >= 0 for m in metrics)


def test_chat_template_prompts_are_token_ids() -> None:
    _, loaded, _ = tiny()
    tok = loaded.tokenizer
    tok.chat_template = "{% for m in messages %}{{ m['content'] }}{% endfor %}="
    ids = encode_prompt(tok, "abc")
    assert all(isinstance(i, int) for i in ids)
    assert tok.decode(ids, skip_special_tokens=True) == "abc="


def test_prompts_too_long_are_refused_up_front() -> None:
    cfg, loaded, task = tiny()
    with pytest.raises(ValueError, match=r"longer than rl.max_prompt_length=3 .*longest has 5"):
        encode_checked(loaded.tokenizer, task.examples, 3, "rl.max_prompt_length")
    with pytest.raises(ValueError, match=r"rl\.max_prompt_length"):
        cfg.rl.max_prompt_length = 4
        RLProducer(loaded, task, cfg, SamplingSettings())


def test_every_generation_config_eos_stops_a_completion() -> None:
    _, loaded, _ = tiny()
    loaded.model.generation_config.eos_token_id = [loaded.tokenizer.eos_token_id, 7]
    assert stop_token_ids(loaded) == tuple(sorted({loaded.tokenizer.eos_token_id, 7}))


def test_resume_refuses_other_settings_and_extends_the_run(tmp_path: Path) -> None:
    train(compose([*QUICK, "trainer.max_steps=2"]), run_dir=tmp_path)
    with pytest.raises(ConfigValidationError) as info:
        train(
            compose([*QUICK, "trainer.max_steps=4", "trainer.learning_rate=0.01", "resume=true"]),
            run_dir=tmp_path,
        )
    assert [p.key for p in info.value.problems] == ["trainer.learning_rate"]
    summary = train(compose([*QUICK, "trainer.max_steps=4", "resume=true"]), run_dir=tmp_path)
    assert summary["steps"] == 4
    (entry,) = [json.loads(line) for line in (tmp_path / "resumes.jsonl").read_text().splitlines()]
    assert entry["from_step"] == 2 and entry["changed"] == {"trainer.max_steps": [2, 4]}


def test_sft_examples_too_long_are_refused(tmp_path: Path) -> None:
    from art_hydra.engine.producer import SFTProducer

    cfg, loaded, task = tiny(["algorithm=sft"])
    task.examples = [Example(prompt="abc=", answer="cba" * 10)]
    with pytest.raises(ValueError, match=r"longer than sft\.max_length"):
        SFTProducer(loaded, task, cfg)


def test_completions_are_saved_for_inspection(tmp_path: Path) -> None:
    train(compose([*QUICK, "trainer.max_steps=2", "producer.log_completions=1"]), run_dir=tmp_path)
    text = (tmp_path / "completions.jsonl").read_text()
    lines = [json.loads(line) for line in text.splitlines()]
    assert len(lines) == 2 and len(lines[0]["samples"]) == 1  # one group...
    group = lines[0]["samples"][0]
    assert len(group["completions"]) == 8  # ...whole (rl.num_generations)
    assert group["completions"][0].keys() == {"text", "reward", "rewards", "advantage"}


def test_the_trainer_computes_with_the_configured_cpu_threads(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """backend.cpu_threads reaches the thread that runs every torch op of the step."""
    from art_hydra.engine.trainer import Trainer

    seen: list[int] = []
    train_step = Trainer.train_step

    def spy(self: Trainer, work: object) -> object:
        seen.append(torch.get_num_threads())
        return train_step(self, work)

    monkeypatch.setattr(Trainer, "train_step", spy)
    before = torch.get_num_threads()
    try:
        train(compose([*QUICK, "trainer.max_steps=2", "backend.cpu_threads=1"]), run_dir=tmp_path)
    finally:
        torch.set_num_threads(before)
    assert seen == [1, 1]
