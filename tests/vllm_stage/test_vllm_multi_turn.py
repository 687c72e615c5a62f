"""Multi-turn tool rollouts on vLLM (rollout.engine=vllm, its CPU build): the loop runs on
the rollout interface, so each turn is a vLLM request whose prompt is the previous ids,
the ids vLLM sampled and the template's tool suffix; the trainer's forward over the
packed rows gives every token vLLM sampled the logprob vLLM reported for it."""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path

import pytest

pytest.importorskip("vllm", reason="the vLLM stage runs in .venv-vllm")

#: A tool template in the tiny llama's characters (no angle brackets or braces there).
TEMPLATE = (
    "{%- for m in messages -%}"
    "{%- if m.role == 'user' -%}u:{{ m.content }}"
    "{%- elif m.role == 'assistant' -%}a:{{ m.content }}"
    "{%- for c in m.tool_calls or [] -%}call {{ c.function.name }}{%- endfor -%}{{ eos_token }}"
    "{%- elif m.role == 'tool' -%}t:{{ m.content }}"
    "{%- endif -%}{%- endfor -%}"
    "{%- if add_generation_prompt -%}a:{%- endif -%}"
)
MISMATCH = 1e-4


@pytest.fixture
def every_turn_calls() -> Iterator[str]:
    """Every stopped turn calls ``lookup``: a random model rolls out several turns."""
    from art_hydra.engine.envs import parsers

    @parsers.register_tool_parser("test_vllm_every_turn")
    def calls(text: str) -> parsers.ParsedTurn:
        return parsers.ParsedTurn(text, (parsers.ToolCall("lookup", {"key": "ab"}),))

    yield "test_vllm_every_turn"
    parsers._PARSERS.pop("test_vllm_every_turn")


def test_multi_turn_rollouts_on_vllm_are_token_exact(
    tiny_llama: Path, tmp_path: Path, every_turn_calls: str
) -> None:
    import torch

    from art_hydra import compose
    from art_hydra.engine.recipe import build_run_parts
    from art_hydra.engine.trainer import eval_mode, packed_logprobs

    template = tmp_path / "tools.jinja"
    template.write_text(TEMPLATE)
    cfg = compose(
        [
            "rollout.engine=vllm",
            "rollout.vllm.enforce_eager=true",
            "rollout.vllm.kv_cache_gib=0.0625",  # (it would reserve gigabytes of memory)
            "model=pretrained",
            f"model.name={tiny_llama}",
            "model.dtype=float32",
            "model.finetune=full",
            "task=tool_lookup",
            f"model.chat_template={template}",
            f"task.tool_parser={every_turn_calls}",
            "rl.max_completion_length=48",
            "rl.max_prompt_length=16",
            "rl.num_generations=4",
            "trainer.per_device_train_batch_size=16",
            "task.num_examples=32",
        ]
    )
    parts = build_run_parts(cfg)
    try:
        producer = parts.producer
        batch = producer.make_inputs()[0]
        assert batch.info["turns_mean"] > 1.2, batch.info
        assert batch.info["tool_calls_mean"] > 0.2, batch.info
        with eval_mode(producer.loaded.model) as model, torch.no_grad():
            values, _ = packed_logprobs(model, batch.to(producer.loaded.device), producer.sampling)
        trained = batch.loss_mask > 0
        gap = (values[trained] - batch.sampler_logprobs[trained]).abs().max().item()
        assert gap < MISMATCH
    finally:
        parts.engine.close()
