"""TRL-format data at run time, on a tiny random-weight Qwen2 folder whose tokenizer has
a chat template: prompts are encoded exactly as transformers' ``apply_chat_template``
encodes them, SFT on ``messages`` trains on the last assistant turn only, and a short
real run trains on a TRL-format parquet file."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pandas as pd
import pytest
from conftest import output_of, run_cli
from family_models import load_family, save_family

from art_hydra.engine.backends.tiny import build_tokenizer
from art_hydra.engine.producer import SFTProducer, encode_prompt, encode_prompts
from art_hydra.preflight import world_problems
from art_hydra.tasks import Example, TaskDataError, build_task

#: A chat template in the characters the tiny tokenizer knows (no newline).
TEMPLATE = (
    "{% for m in messages %}<{{ m['role'] }}>{{ m['content'] }}</s>{% endfor %}"
    "{% if add_generation_prompt %}<assistant>{% endif %}"
)
CHAT = [
    {"role": "system", "content": "Add."},
    {"role": "user", "content": "2+2="},
    {"role": "assistant", "content": "4"},
    {"role": "user", "content": "3+4="},
    {"role": "assistant", "content": "7"},
]
QUICK = [
    "trainer.max_steps=2",
    "trainer.per_device_train_batch_size=8",
    "logging.progress_bar=off",
    "logging.tensorboard=false",
    "logging.plot=false",
]


@pytest.fixture(scope="module")
def chat_model(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """A Qwen2 folder (random weights, character tokenizer) with a chat template."""
    folder = save_family(tmp_path_factory.mktemp("chat") / "qwen2", "qwen2", {})
    from transformers import AutoTokenizer

    tokenizer = AutoTokenizer.from_pretrained(folder)
    tokenizer.chat_template = TEMPLATE
    tokenizer.save_pretrained(folder)
    return folder


def _ids(tokenizer: Any, messages: list[dict[str, str]]) -> list[int]:
    out = tokenizer.apply_chat_template(messages, add_generation_prompt=True, tokenize=True)
    return list(out["input_ids"] if hasattr(out, "keys") else out)


def _data(tmp_path: Path, rows: list[dict[str, Any]]) -> Path:
    """JSON lines: one file may mix text and conversational prompts (parquet may not)."""
    path = tmp_path / "data.jsonl"
    path.write_text("".join(json.dumps(row) + "\n" for row in rows))
    return path


def test_prompts_are_encoded_as_the_chat_template_encodes_them(
    chat_model: Path, tmp_path: Path
) -> None:
    rows = [
        {"prompt": [{"role": "user", "content": "3+4="}], "solution": "7"},
        {"prompt": "1+1=", "solution": "2"},
    ]
    overrides = [
        "task=dataset",
        f"task.path={_data(tmp_path, rows)}",
        "task.columns.answer=solution",
        "task.system_prompt=Add.",
        "rl.max_prompt_length=48",  # the system + user turns take 41 tokens
        "rl.max_completion_length=8",
    ]
    cfg, loaded = load_family(chat_model, overrides=overrides)
    tok = loaded.tokenizer
    conversational, text = build_task(cfg).examples
    # task.system_prompt leads a conversation that has no system turn of its own
    led = [{"role": "system", "content": "Add."}, {"role": "user", "content": "3+4="}]
    assert encode_prompt(tok, conversational) == _ids(tok, led)
    # a text prompt under task.system_prompt: system, then the text as the user's turn
    system = [{"role": "system", "content": "Add."}, {"role": "user", "content": "1+1="}]
    assert encode_prompt(tok, text) == _ids(tok, system)
    assert encode_prompts(tok, [text, conversational, text]) == [
        _ids(tok, system),
        encode_prompt(tok, conversational),
        _ids(tok, system),
    ]
    assert encode_prompt(tok, "5=") == _ids(tok, [{"role": "user", "content": "5="}])
    assert world_problems(cfg, None) == []
    # Without a system prompt a standard text row is encoded as TRL encodes it: the text
    # alone, no template (TRL templates conversational rows only).
    cfg, _ = load_family(chat_model, overrides=[o for o in overrides if "system" not in o])
    conversational, text = build_task(cfg).examples
    assert text.plain and encode_prompt(tok, text) == list(tok("1+1=")["input_ids"])
    assert encode_prompt(tok, conversational) == _ids(tok, [{"role": "user", "content": "3+4="}])
    assert world_problems(cfg, None) == []


def test_a_conversation_is_refused_by_a_tokenizer_without_a_template() -> None:
    example = Example(prompt="hi", messages=(("user", "hi"),))
    with pytest.raises(TaskDataError, match="no chat template"):
        encode_prompt(build_tokenizer(), example)


def test_sft_on_messages_trains_every_assistant_turn(chat_model: Path, tmp_path: Path) -> None:
    """A conversation with two assistant turns trains both (each with its end token), as
    a two-turn rollout would have sampled them; the system and user turns are context."""
    overrides = [
        "task=dataset",
        f"task.path={_data(tmp_path, [{'messages': CHAT}])}",
        "algorithm=sft",
        "sft.max_length=128",
        "model.max_seq_length=128",
    ]
    cfg, loaded = load_family(chat_model, overrides=overrides)
    task = build_task(cfg)
    producer = SFTProducer(loaded, task, cfg)
    (sequence,) = producer.sequences.values()
    tok = loaded.tokenizer
    # Context up to the first assistant turn, as a rollout's prompt is encoded.
    prompt = _ids(tok, CHAT[:2])
    assert sequence.tokens[: len(prompt)] == prompt and sequence.prompt_len == len(prompt)
    completion = sequence.tokens[sequence.prompt_len :]
    assert sequence.completion_mask is not None and not sequence.train_prompt
    trained = [t for t, m in zip(completion, sequence.completion_mask, strict=True) if m]
    untrained = [t for t, m in zip(completion, sequence.completion_mask, strict=True) if not m]
    four, seven = (list(tok(a, add_special_tokens=False)["input_ids"]) for a in ("4", "7"))
    assert trained[: len(four)] == four and trained[-len(seven) - 1 : -1] == seven
    # The template's own turn end (text here, not the EOS id the turns stop on) and the
    # next user turn are context, as a rollout's tool suffix would be.
    assert tok.decode(untrained) == "</s><user>3+4=</s><assistant>"


@pytest.mark.slow
def test_training_on_a_trl_format_parquet_file(chat_model: Path, tmp_path: Path) -> None:
    """RL on conversational prompts with a `solution` column, then SFT on `messages`."""
    prompts = [
        {"prompt": [{"role": "user", "content": f"{a}+{b}="}], "solution": str(a + b)}
        for a in range(4)
        for b in range(4)
    ]
    rl = tmp_path / "prompts.parquet"
    pd.DataFrame(prompts).to_parquet(rl)
    sft = tmp_path / "chats.parquet"
    pd.DataFrame([{"messages": CHAT}] * 8).to_parquet(sft)
    model = [f"model.name={chat_model}", "model.source=pretrained", "model.finetune=full"]
    runs = {
        "rl": [f"task.path={rl}", "task.columns.answer=solution", "rl.max_prompt_length=32"],
        "sft": [f"task.path={sft}", "algorithm=sft", "sft.max_length=128"],
    }
    for name, extra in runs.items():
        proc = run_cli(
            "task=dataset",
            *model,
            "model.max_seq_length=128",
            "rl.max_completion_length=8",
            *extra,
            *QUICK,
            f"hydra.run.dir={name}",
            cwd=tmp_path,
            timeout=300,
        )
        assert proc.returncode == 0, output_of(proc)
        steps = (tmp_path / name / "metrics.jsonl").read_text().splitlines()
        assert [json.loads(line)["step"] for line in steps] == [1, 2]
    samples = (tmp_path / "rl" / "completions.jsonl").read_text()
    assert '"prompt": "' in samples and "+" in samples
