"""Multi-turn tool rollouts, token-exact: what the trainer packs is the prompt, the ids
the engine sampled and the template's tool suffixes, with only sampled ids trained, on
the tiny model's tool template and on Qwen 2.5's (whose turn end outlives its stop id)."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pytest
from model_folders import QWEN_TOOLS, char_tokenizer, random_model

from art_hydra.config.composition import compose
from art_hydra.engine.packing import pack
from art_hydra.engine.recipe import build_run_parts
from art_hydra.engine.rollout.base import Completion, finish_reason
from art_hydra.tasks.tool_lookup import value_of

pytestmark = pytest.mark.model

CALL = '<tool_call>{"name": "lookup", "arguments": {"key": "%s"}}</tool_call>'
QUICK = [
    "experiment=tool_use",
    "rl.sft_warm_start_steps=0",
    "trainer.per_device_train_batch_size=8",
    "rl.num_generations=4",
    "task.num_examples=16",
]


class ScriptedTurns:
    """A rollout engine that answers as a tool-using model would: a call of ``lookup``
    with the prompt's key, then (once the result is in its context) that result. Its
    sampled ids are kept, to compare with what the trainer packs."""

    model = None

    def __init__(self, tokenizer: Any, call: str) -> None:
        self.tok, self.call = tokenizer, call
        self.sampled: list[list[int]] = []
        #: The longest sequence any request allowed (prompt + what it may sample).
        self.reach = 0

    def generate(self, requests: Any, settings: Any, generator: Any, timeout_s: Any = None) -> Any:
        out = []
        for request in requests:
            self.reach = max(self.reach, len(request.prompt_ids) + request.max_tokens)
            text = self.tok.decode(list(request.prompt_ids))
            key = text.rsplit("user\n", 1)[-1][:2] if "user\n" in text else text.split("<u>")[1][:2]
            if "<tool_call>" in text:
                key = json.loads(text.split("<tool_call>")[1].split("</tool_call>")[0])
                body = value_of(key["arguments"]["key"])
            else:
                body = self.call % key
            ids = self.tok(body, add_special_tokens=False)["input_ids"]
            ids = [*ids, self.tok.eos_token_id]
            self.sampled.append(ids)
            out.append(Completion(ids, [-0.25] * len(ids), finish_reason(ids, request.stop_ids)))
        return out

    def sync_weights(self) -> None:
        pass


def _qwen_folder(tmp: Path) -> Path:
    size = char_tokenizer(tmp, QWEN_TOOLS, eos="<|im_end|>")
    random_model(tmp, "qwen3", size)  # (qwen2 folders get Qwen2Tokenizer, byte-level)
    return tmp


def _template_messages(conversation: list[dict[str, Any]]) -> list[dict[str, Any]]:
    """A completions.jsonl conversation (OpenAI shape) as templates take it."""
    out = []
    for message in conversation:
        message = dict(message)
        if "tool_calls" in message:
            message["tool_calls"] = [
                {
                    "type": "function",
                    "function": {
                        **c["function"],
                        "arguments": json.loads(c["function"]["arguments"]),
                    },
                }
                for c in message["tool_calls"]
            ]
        out.append(message)
    return out


@pytest.mark.parametrize("template", ["tiny", "qwen"])
def test_trained_ids_are_prompt_sampled_and_suffix_ids(template: str, tmp_path: Path) -> None:
    overrides = list(QUICK)
    call = '<tool_call>{"name": "lookup", "arguments": {"key": "%s"}}</tool_call>'
    if template == "qwen":
        folder = _qwen_folder(tmp_path)
        overrides += [
            "model=pretrained",
            f"model.name={folder}",
            "model.chat_template=null",
            "model.finetune=full",
            "rl.max_prompt_length=512",
            "rl.max_completion_length=160",
            "model.max_seq_length=700",
        ]
        call = '<tool_call>\n{"name": "lookup", "arguments": {"key": "%s"}}\n</tool_call>'
    parts = build_run_parts(compose(overrides))
    producer = parts.producer
    tok = producer.loaded.tokenizer
    engine = ScriptedTurns(tok, call)
    producer.engine = engine
    (mini,) = producer._generate()
    assert mini.info["tool_calls_mean"] == 1.0 and mini.info["turns_mean"] == 2.0
    assert mini.info["reward_mean"] == 1.0  # the answer is the tool's result
    schemas = producer.agent.schemas
    for g, sample in enumerate(mini.samples):
        for i, completion in enumerate(sample["completions"]):
            seq = mini.sequences[g * 4 + i]
            conversation = completion["messages"]
            roles = [m["role"] for m in conversation]
            assert roles == ["user", "assistant", "tool", "assistant"]
            assert conversation[1]["tool_calls"][0]["function"]["name"] == "lookup"
            rendered = tok.apply_chat_template(
                _template_messages(conversation), tools=schemas, tokenize=True
            )
            rendered = list(rendered["input_ids"] if hasattr(rendered, "keys") else rendered)
            # The template's own rendering of the conversation, up to the last stop id:
            # nothing sampled was re-tokenized, nothing of the template is missing.
            assert rendered[: len(seq.tokens)] == seq.tokens
            assert tok.decode(rendered[len(seq.tokens) :]).strip() == ""
            mask = seq.completion_mask
            assert mask is not None and len(mask) == len(seq.tokens) - seq.prompt_len
            completion_ids = seq.tokens[seq.prompt_len :]
            trained = [t for t, m in zip(completion_ids, mask, strict=True) if m]
            # Turn by turn, every trajectory's turn is one request of the same call.
            index, count = g * 4 + i, len(mini.sequences)
            first, second = engine.sampled[index], engine.sampled[count + index]
            assert trained == first + second
            assert tok.decode(second[:-1]) == value_of(sample["prompt"])
    # No request let a trajectory grow past its prompt and the completion budget (the
    # model's positions): each asked for at most what its trajectory had left.
    longest_prompt = max(s.prompt_len for s in mini.sequences)
    assert engine.reach <= longest_prompt + producer.rl.max_completion_length
    batch = pack(mini.sequences, producer.capacity, tok.pad_token_id, producer.loaded.layout)
    assert batch.loss_tokens == sum(s.loss_tokens for s in mini.sequences)
    sampled = sum(sum(s.completion_mask or []) for s in mini.sequences)
    assert batch.loss_tokens == sampled  # every sampled id, and nothing else, trains
    assert int(batch.completion_slots.sum()) == sum(
        len(s.tokens) - s.prompt_len for s in mini.sequences
    )


def test_sampler_logprobs_sit_on_the_sampled_tokens_only(tmp_path: Path) -> None:
    parts = build_run_parts(compose(QUICK))
    producer = parts.producer
    producer.engine = ScriptedTurns(
        producer.loaded.tokenizer,
        '<tool_call>{"name": "lookup", "arguments": {"key": "%s"}}</tool_call>',
    )
    batch = producer.make_inputs()[0]
    trained = batch.loss_mask > 0
    assert batch.sampler_logprobs is not None
    assert (batch.sampler_logprobs[trained] == -0.25).all()
    assert (batch.sampler_logprobs[~trained] == 0).all()


@pytest.fixture
def every_turn_calls() -> Any:
    """A tool-call format under which every stopped turn calls ``lookup``: a random model
    then rolls out several turns, each sampled for real after a tool suffix."""
    from art_hydra.engine.envs import parsers

    @parsers.register_tool_parser("test_every_turn_calls")
    def calls(text: str) -> parsers.ParsedTurn:
        return parsers.ParsedTurn(text, (parsers.ToolCall("lookup", {"key": "ab"}),))

    yield "test_every_turn_calls"
    parsers._PARSERS.pop("test_every_turn_calls")


def test_the_trainer_scores_the_tokens_the_sampler_drew(every_turn_calls: str) -> None:
    """Real sampling over several turns: the training forward over the packed rows gives
    every sampled token the logprob the sampler drew it with (same model, float32), so
    no sampled id moved, and no suffix id was taken for a sampled one."""
    from art_hydra.engine.trainer import eval_mode, packed_logprobs

    parts = build_run_parts(compose([*QUICK, f"task.tool_parser={every_turn_calls}"]))
    producer = parts.producer
    batch = producer.make_inputs()[0]
    assert batch.info["turns_mean"] > 1.2, batch.info  # several turns, sampled for real
    assert 0 < batch.info["masked_token_share"] < 1
    with eval_mode(producer.loaded.model) as model:
        values, _ = packed_logprobs(model, batch.to(producer.loaded.device), producer.sampling)
    trained = batch.loss_mask > 0
    gap = (values.detach()[trained] - batch.sampler_logprobs[trained]).abs().max().item()
    assert gap < 1e-4


def test_evaluation_rolls_out_with_the_tools_too() -> None:
    """Evaluation rolls each held-out prompt out as training does: with its own
    environment and the tool loop, so an agent that calls its tool scores its result."""
    from art_hydra.config.typed import typed_config
    from art_hydra.engine.evaluation import Evaluator

    cfg = compose([*QUICK, "eval.fraction=0.25"])
    parts = build_run_parts(cfg)
    producer = parts.producer
    engine = ScriptedTurns(producer.loaded.tokenizer, CALL)
    evaluator = Evaluator.for_run(
        typed_config(cfg),
        producer.loaded,
        parts.eval_examples,
        parts.eval_rewards,
        None,
        engine,
        producer.agent,
    )
    assert evaluator is not None and evaluator.agent is producer.agent
    metrics, _ = evaluator.evaluate(1)
    assert metrics["eval/reward"] == 1.0 and metrics["eval/exact"] == 1.0, metrics
    assert len(engine.sampled) == 2 * len(parts.eval_examples)  # a call, then the answer
