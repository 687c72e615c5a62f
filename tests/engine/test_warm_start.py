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
from art_hydra.engine.conversation import example_sequence
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


def _hooked(monkeypatch: pytest.MonkeyPatch) -> None:
    """SFTProducer._sequence with the conversation hook the producer is to carry."""
    plain = SFTProducer._sequence

    def sequence(self: SFTProducer, example: Example) -> Any:
        if example.conversation:
            train_prompt = not self.sft.completion_only_loss
            return example_sequence(self.loaded.tokenizer, example, None, train_prompt)
        return plain(self, example)

    monkeypatch.setattr(SFTProducer, "_sequence", sequence)


def test_sft_on_tool_conversations_trains_only_assistant_turns(
    tool_model: Path, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    _hooked(monkeypatch)
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
