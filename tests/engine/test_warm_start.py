"""SFT on tool conversations and the RL warm start, on a tiny random-weight model with
the tiny model's character tokenizer and a tool template: SFT trains only assistant
turns and its loss is finite; ``rl.sft_warm_start_steps`` trains on the demonstrations
(loss falls) before the first RL step of a new run, and a resume does not repeat it."""

from __future__ import annotations

import json
import math
import random
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
from family_models import save_family
from test_conversation import TINY

from art_hydra import compose
from art_hydra.engine import warm_start as warm_start_module
from art_hydra.engine.producer import SFTProducer
from art_hydra.run import train
from art_hydra.tasks import Example, build_task

pytestmark = pytest.mark.model

QUICK = [
    "model.source=pretrained",
    "model.finetune=full",
    "model.max_seq_length=128",
    "backend.device=cpu",
    "logging.progress_bar=off",
    "logging.tensorboard=false",
    "logging.plot=false",
    "trainer.learning_rate=0.003",
]


def chat(word: str) -> list[dict[str, Any]]:
    """Reverse ``word`` with the tool's help: a call, its result, the answer."""
    call = {"type": "function", "function": {"name": "rev", "arguments": {"s": word}}}
    return [
        {"role": "user", "content": word},
        {"role": "assistant", "content": "", "tool_calls": [call]},
        {"role": "tool", "name": "rev", "content": word[::-1]},
        {"role": "assistant", "content": word[::-1]},
    ]


def demos(rng: random.Random, num_examples: int, **params: Any) -> Iterator[Example]:
    """A generator of demonstrations (``task.generator``), the reverse task's answers."""
    for _ in range(num_examples):
        word = "".join(rng.choice("abcd") for _ in range(3))
        yield Example.from_conversation(chat(word))


@pytest.fixture(scope="module")
def tool_model(tmp_path_factory: pytest.TempPathFactory) -> Path:
    folder = save_family(tmp_path_factory.mktemp("tools") / "qwen2", "qwen2", {})
    from transformers import AutoTokenizer

    tokenizer = AutoTokenizer.from_pretrained(folder)
    tokenizer.chat_template = TINY
    tokenizer.save_pretrained(folder)
    return folder


def test_sft_on_tool_conversations_trains_only_assistant_turns(
    tool_model: Path, tmp_path: Path
) -> None:
    path = tmp_path / "chats.jsonl"
    path.write_text("".join(json.dumps({"messages": chat(w)}) + "\n" for w in ("abc", "dab")))
    cfg = compose(
        [
            *QUICK,
            f"model.name={tool_model}",
            "task=dataset",
            f"task.path={path}",
            "algorithm=sft",
            "sft.max_length=128",
            "trainer.max_steps=3",
            "trainer.per_device_train_batch_size=2",
        ]
    )
    from art_hydra.engine.backends import load_model

    task = build_task(cfg)
    loaded = load_model(cfg.model, cfg.backend, cfg.seed)
    (batch,) = SFTProducer(loaded, task, cfg).make_inputs()
    ids = batch.targets[batch.loss_mask.bool()].tolist()
    trained = "".join(loaded.tokenizer.convert_ids_to_tokens(ids))
    # (this folder's saved character tokenizer encodes no spaces)
    assert sorted(trained.split("<eos>")) == sorted(
        ["", '[callrev{"s":"abc"}]', "cba", '[callrev{"s":"dab"}]', "bad"]
    )
    summary = train(cfg, run_dir=tmp_path / "run")
    lines = (tmp_path / "run" / "metrics.jsonl").read_text().splitlines()
    losses = [json.loads(line)["loss"] for line in lines]
    assert summary["steps"] == 3 and len(losses) == 3 and all(map(math.isfinite, losses))


def test_warm_start_trains_then_rl_and_a_resume_does_not_repeat_it(
    tool_model: Path, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    calls: list[dict[str, float]] = []
    real = warm_start_module.warm_start

    def counted(*args: Any) -> dict[str, float]:
        calls.append(real(*args))
        return calls[-1]

    monkeypatch.setattr(warm_start_module, "warm_start", counted)
    rl = [
        *QUICK,
        f"model.name={tool_model}",
        "task.generator=test_warm_start.demos",
        "task.num_examples=8",
        "rl.sft_warm_start_steps=5",
        "rl.max_completion_length=8",
        "checkpoint.every_steps=1",
    ]
    run_dir = tmp_path / "run"
    first = train(compose([*rl, "trainer.max_steps=2"]), run_dir=run_dir)
    assert first["steps"] == 2 and len(calls) == 1
    (found,) = calls
    assert found["warm_start/loss_last"] < found["warm_start/loss_first"], found
    again = train(compose([*rl, "trainer.max_steps=3", "resume=true"]), run_dir=run_dir)
    assert again["steps"] == 3 and len(calls) == 1  # the resume did not warm-start again


def test_the_kl_reference_is_the_warm_started_policy_and_survives_a_resume() -> None:
    """After the warm start the KL anchors to the warm-started weights (TRL's SFT-then-RL
    reference), and a checkpoint carries them: a resumed trainer, whose reference would
    otherwise be rebuilt from the untrained model, gets them back exactly."""
    import torch
    from conftest_model import tiny

    from art_hydra.config.typed import typed_config
    from art_hydra.engine.rl.sampling import SamplingSettings
    from art_hydra.engine.trainer import Trainer, TrainingLoss

    cfg, loaded, _ = tiny(["rl.beta=0.04", "model.finetune=full"])
    run = typed_config(cfg)
    loss = TrainingLoss.for_rl(run.rl, SamplingSettings.from_config(run.rl, ()))
    trainer = Trainer(loaded, run.trainer, loss, None)
    with torch.no_grad():  # what a warm start does to the weights
        for param in loaded.model.parameters():
            param.add_(0.01)
    trainer.anchor_reference()
    policy = {k: v.float() for k, v in loaded.model.state_dict().items()}
    anchored = {k: v.float() for k, v in trainer.reference.state_dict().items()}
    assert all(torch.allclose(anchored[k], policy[k], atol=1e-2) for k in policy)
    tensors, plain = trainer.state_dict()

    _, fresh_loaded, _ = tiny(["rl.beta=0.04", "model.finetune=full"])
    resumed = Trainer(fresh_loaded, run.trainer, loss, None)
    before = {k: v.clone() for k, v in resumed.reference.state_dict().items()}
    resumed.load_state_dict(tensors, plain)
    after = resumed.reference.state_dict()
    assert any(not torch.equal(before[k], after[k]) for k in before)
    assert all(torch.equal(after[k], trainer.reference.state_dict()[k]) for k in after)
    assert resumed.reference_anchored
