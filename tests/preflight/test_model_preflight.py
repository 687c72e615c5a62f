"""Model folders checked before anything loads, without torch or transformers: tiny
random-weight folders of real families (saved with ``save_pretrained``), broken the ways
downloads and hand edits break them, and the pre-flight's token counts compared with
transformers' own encoding of the same folders."""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
from pathlib import Path

import pytest
from conftest import output_of, problem_about, report_entries, run_cli
from model_folders import (
    CHATML,
    GEMMA_LIKE,
    LLAMA_LIKE,
    hub_cache_entry,
)
from model_folders import (
    char_tokenizer as _char_tokenizer,
)
from model_folders import (
    gpt2_tokenizer as _gpt2_tokenizer,
)
from model_folders import (
    qwen_tokenizer as _qwen_tokenizer,
)
from model_folders import (
    random_model as _model,
)
from model_folders import (
    sentencepiece_style as _sentencepiece_style,
)

from art_hydra import Severity, compose
from art_hydra.folder_tokenizer import load as load_folder_tokenizer
from art_hydra.preflight import world_problems
from art_hydra.preflight.lengths import FolderCounter, Lengths, TinyCounter, length_problems
from art_hydra.preflight.model import NO_SAMPLING
from art_hydra.tasks.examples import Example


@pytest.fixture(scope="module")
def families(tmp_path_factory: pytest.TempPathFactory) -> dict[str, Path]:
    """One folder per family, built once per module (tests copy before breaking one)."""
    root = tmp_path_factory.mktemp("families")
    tokenizers = {
        "qwen2": _qwen_tokenizer,
        "llama": lambda f: _sentencepiece_style(f, "LlamaTokenizer", LLAMA_LIKE),
        "gpt2": _gpt2_tokenizer,
        "gemma": lambda f: _sentencepiece_style(f, "GemmaTokenizer", GEMMA_LIKE),
        "mistral": _char_tokenizer,
        "sharded": lambda f: _char_tokenizer(f, template=CHATML, bos_post=False),
    }
    families = {"sharded": "llama"}
    extra = {
        "llama": {"tie_word_embeddings": True},
        "gpt2": {"n_positions": 32},
        "sharded": {"tie_word_embeddings": False},
    }
    folders = {}
    for name, build in tokenizers.items():
        folder = root / name
        vocab = build(folder)
        shard = "20KB" if name == "sharded" else None
        _model(folder, families.get(name, name), vocab, shard=shard, **extra.get(name, {}))
        folders[name] = folder
    return folders


def _drop_tokenizer(folder: Path) -> None:
    for pattern in ("tokenizer*", "chat_template*", "special_tokens_map.json", "vocab.json"):
        for path in folder.glob(pattern):
            path.unlink()
    (folder / "merges.txt").unlink(missing_ok=True)


def _vocab(folder: Path) -> int:
    return json.loads((folder / "config.json").read_text())["vocab_size"]


def _copy(families: dict[str, Path], name: str, tmp_path: Path) -> Path:
    return Path(shutil.copytree(families[name], tmp_path / name))


def _pretrained(folder: Path | str, *extra: str) -> list[str]:
    return [
        "model=pretrained",
        f"model.name={folder}",
        "model.finetune=lora",
        "model.lora.modules_to_save=[]",
        "model.max_seq_length=96",
        "rl.max_prompt_length=80",
        "rl.max_completion_length=16",
        *extra,
    ]


#: GPT-2's layers (Conv1D) for LoRA: the default targets are Llama's, which it lacks.
GPT2_TARGETS = "model.lora.target_modules=[c_attn,c_proj,c_fc]"


def _world(overrides: list[str]) -> list:
    return world_problems(compose(overrides), None)


def _reasons(overrides: list[str], key: str = "model.name") -> list[str]:
    return [p.reason for p in _world(overrides) if p.key == key]


# ---- the folders that load pass ------------------------------------------------------


@pytest.mark.parametrize("name", ["qwen2", "llama", "gemma", "mistral", "sharded"])
def test_real_family_folders_pass(families: dict[str, Path], name: str) -> None:
    assert _world(_pretrained(families[name])) == []


def test_the_preflight_of_a_model_folder_imports_neither_torch_nor_transformers(
    families: dict[str, Path], tmp_path: Path
) -> None:
    data = tmp_path / "data.jsonl"
    data.write_text('{"prompt": "ab=", "answer": "ba"}\n')
    overrides = [*_pretrained(families["qwen2"]), "task=jsonl", f"task.path={data}"]
    code = (
        "import sys\n"
        "from art_hydra import compose\n"
        "from art_hydra.preflight import world_problems\n"
        f"found = world_problems(compose({overrides!r}), None)\n"
        "assert found == [], found\n"
        "heavy = [m for m in ('torch', 'transformers', 'peft') if m in sys.modules]\n"
        "assert not heavy, heavy\n"
    )
    subprocess.run([sys.executable, "-c", code], check=True, timeout=120)


# ---- broken folders -------------------------------------------------------------------


def test_positions_below_max_seq_length_are_refused_with_one_fix(
    families: dict[str, Path],
) -> None:
    """gpt2 with n_positions=32 under model.max_seq_length=64 crashed mid-run (IndexError)."""
    overrides = _pretrained(
        families["gpt2"], GPT2_TARGETS, "model.max_seq_length=64", "rl.max_prompt_length=16"
    )
    problem = problem_about(_world(overrides), "model.max_seq_length")
    assert problem.severity == Severity.error
    assert "n_positions=32" in problem.reason
    assert problem.fix.overrides() == ["model.max_seq_length=32"]
    # The budgets no longer fit either: the one fix sets them together.
    longer = _pretrained(
        families["gpt2"], GPT2_TARGETS, "model.max_seq_length=64", "rl.max_prompt_length=40"
    )
    fixed = problem_about(_world(longer), "model.max_seq_length").fix.overrides()
    assert fixed[0] == "model.max_seq_length=32" and len(fixed) == 3
    cfg = compose([*longer, *fixed])
    assert cfg.rl.max_prompt_length + cfg.rl.max_completion_length <= 32
    # The budgets are sized from the data's own prompts: the fixed run passes the checks.
    assert [p for p in world_problems(cfg, None) if p.is_error] == []


def test_the_position_limit_is_refused_by_the_cli_before_any_model_loads(
    families: dict[str, Path], tmp_path: Path
) -> None:
    overrides = _pretrained(
        families["gpt2"], GPT2_TARGETS, "model.max_seq_length=64", "rl.max_prompt_length=16"
    )
    proc = run_cli(*overrides, cwd=tmp_path)
    out = output_of(proc)
    assert proc.returncode == 1, out
    assert [e[0] for e in report_entries(out)] == ["model.max_seq_length"]
    assert "Traceback" not in out and not (tmp_path / "outputs").exists()


def test_a_tokenizer_without_eos_or_pad(families: dict[str, Path], tmp_path: Path) -> None:
    folder = _copy(families, "llama", tmp_path)
    _drop_tokenizer(folder)
    _char_tokenizer(folder, eos=None, pad=None)
    # The configs name eos_token_id=2: the run takes it, and the report says so.
    (derived,) = _world(_pretrained(folder))
    assert derived.severity == Severity.warning
    assert "'<eos>' from generation_config.json eos_token_id=2" in derived.reason
    assert "as the pad token" in derived.reason
    for name in ("config.json", "generation_config.json"):
        config = json.loads((folder / name).read_text())
        config.pop("eos_token_id", None)
        (folder / name).write_text(json.dumps(config))
    (refused,) = _world(_pretrained(folder))
    assert refused.severity == Severity.error and "no EOS token" in refused.reason


def test_a_folder_without_tokenizer_files(families: dict[str, Path], tmp_path: Path) -> None:
    folder = _copy(families, "qwen2", tmp_path)
    _drop_tokenizer(folder)
    (reason,) = _reasons(_pretrained(folder))
    assert "holds no tokenizer files" in reason
    assert "sentencepiece" not in reason and "tiktoken" not in reason
    (folder / "tokenizer.model").write_bytes(b"\x00")  # sentencepiece only: checked at load
    (only_sp,) = _world(_pretrained(folder))
    import importlib.util

    if any(importlib.util.find_spec(m) for m in ("sentencepiece", "tiktoken")):
        assert only_sp.severity == Severity.warning
        assert "checked only after it loads" in only_sp.reason
    else:  # the load would fail: neither package that reads tokenizer.model is here
        assert only_sp.severity == Severity.error and "pip install sentencepiece" in str(
            only_sp.fix.render()
        )


def test_a_tokenizer_json_that_does_not_load(families: dict[str, Path], tmp_path: Path) -> None:
    folder = _copy(families, "qwen2", tmp_path)
    (folder / "tokenizer.json").write_text('{"model": {"type": "Nope"}}')
    (reason,) = _reasons(_pretrained(folder))
    assert "tokenizer.json cannot be loaded" in reason


def test_a_sharded_folder_missing_a_shard(families: dict[str, Path], tmp_path: Path) -> None:
    folder = _copy(families, "sharded", tmp_path)
    shards = sorted(folder.glob("model-*.safetensors"))
    assert len(shards) > 2
    shards[1].unlink()
    (reason,) = _reasons(_pretrained(folder))
    assert f"lacks 1 of the {len(shards)} weight shards" in reason and shards[1].name in reason


def test_a_truncated_safetensors_file(families: dict[str, Path], tmp_path: Path) -> None:
    folder = _copy(families, "qwen2", tmp_path)
    weights = folder / "model.safetensors"
    with weights.open("r+b") as handle:
        handle.truncate(weights.stat().st_size - 100)
    (reason,) = _reasons(_pretrained(folder))
    assert "model.safetensors is truncated" in reason
    with weights.open("r+b") as handle:
        handle.truncate(40)  # the header itself cut
    (reason,) = _reasons(_pretrained(folder))
    assert "header" in reason and "truncated" in reason


def test_an_unknown_model_type(families: dict[str, Path], tmp_path: Path) -> None:
    folder = _copy(families, "qwen2", tmp_path)
    config = json.loads((folder / "config.json").read_text())
    (folder / "config.json").write_text(json.dumps({**config, "model_type": "qwen99"}))
    (reason,) = _reasons(_pretrained(folder))
    assert "model_type='qwen99'" in reason and "does not know" in reason


@pytest.mark.parametrize("model_type", ["t5", "vit", "clip"])
def test_a_model_type_without_a_causal_lm_class(model_type: str, tmp_path: Path) -> None:
    """A type transformers knows but AutoModelForCausalLM cannot build (an encoder-decoder,
    a vision or an audio model) would fail at load: refused before it."""
    from conftest import write_model_files

    folder = write_model_files(tmp_path / model_type, {"model_type": model_type})
    (reason,) = _reasons(_pretrained(folder))
    assert f"model_type={model_type!r}" in reason and "causal language model" in reason


def test_sizes_that_do_not_match_the_config(families: dict[str, Path], tmp_path: Path) -> None:
    folder = _copy(families, "llama", tmp_path)
    config = json.loads((folder / "config.json").read_text())
    vocab = config["vocab_size"]
    (folder / "config.json").write_text(json.dumps({**config, "hidden_size": 48}))
    (reason,) = _reasons(_pretrained(folder))
    assert f"model.embed_tokens.weight has shape [{vocab}, 32]" in reason
    assert "hidden_size=48" in reason
    (folder / "config.json").write_text(json.dumps({**config, "vocab_size": vocab + 5}))
    (reason,) = _reasons(_pretrained(folder))
    assert f"vocab_size={vocab + 5} (rows)" in reason


# ---- hub ids, from the local cache ---------------------------------------------------


def test_a_hub_id_absent_from_the_cache_is_one_problem_naming_the_download(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Absent from the cache: an error where the hub does not answer (a closed port here),
    a warning where it does (a socket listening here) or HF_HUB_OFFLINE=0 says so."""
    import socket

    monkeypatch.setenv("HF_HOME", str(tmp_path))
    for var in ("HF_HUB_CACHE", "HUGGINGFACE_HUB_CACHE", "HF_HUB_OFFLINE", "TRANSFORMERS_OFFLINE"):
        monkeypatch.delenv(var, raising=False)
    for var in ("HTTPS_PROXY", "https_proxy"):
        monkeypatch.delenv(var, raising=False)
    with socket.socket() as closed:  # a port nobody listens on once this closes
        closed.bind(("127.0.0.1", 0))
        port = closed.getsockname()[1]
    monkeypatch.setenv("HF_ENDPOINT", f"http://127.0.0.1:{port}")
    (problem,) = _world(_pretrained("acme/tiny-model"))
    assert problem.key == "model.name" and problem.severity == Severity.error
    assert f"127.0.0.1:{port}" in problem.reason
    assert "hf download acme/tiny-model" in problem.fix.render()
    with socket.socket() as hub:
        hub.bind(("127.0.0.1", 0))
        hub.listen()
        monkeypatch.setenv("HF_ENDPOINT", f"http://127.0.0.1:{hub.getsockname()[1]}")
        (online,) = _world(_pretrained("acme/tiny-model"))
    assert online.severity == Severity.warning and "will download it" in online.reason
    monkeypatch.setenv("HF_ENDPOINT", f"http://127.0.0.1:{port}")
    monkeypatch.setenv("HF_HUB_OFFLINE", "0")  # downloads allowed, explicitly
    (allowed,) = _world(_pretrained("acme/tiny-model"))
    assert allowed.severity == Severity.warning
    monkeypatch.setenv("HF_HUB_OFFLINE", "1")
    (offline,) = _world(_pretrained("acme/tiny-model"))
    assert offline.severity == Severity.error and "HF_HUB_OFFLINE" in offline.reason


def test_a_hub_id_absent_is_refused_by_the_cli_at_once(tmp_path: Path) -> None:
    env = {"HF_HOME": str(tmp_path / "hf"), "HF_HUB_OFFLINE": "1"}
    proc = run_cli(*_pretrained("acme/tiny-model"), cwd=tmp_path, env=env)
    out = output_of(proc)
    assert proc.returncode == 1, out
    assert "hf download acme/tiny-model" in out and "Traceback" not in out


def test_a_cached_hub_id_is_checked_in_its_snapshot(
    families: dict[str, Path], tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setenv("HF_HOME", str(tmp_path))
    monkeypatch.delenv("HF_HUB_CACHE", raising=False)
    hub_cache_entry(families["qwen2"], tmp_path, "acme/tiny-qwen")
    assert _world(_pretrained("acme/tiny-qwen")) == []
    # The snapshot's files are checked like a folder's: the prompt budget with its template.
    long = problem_about(
        _world(_pretrained("acme/tiny-qwen", "rl.max_prompt_length=4")), "rl.max_prompt_length"
    )
    assert "chat template" in long.reason
    (
        tmp_path
        / "hub"
        / "models--acme--tiny-qwen"
        / "snapshots"
        / "0123abcd"
        / "model.safetensors"
    ).unlink()
    (partial,) = _world(_pretrained("acme/tiny-qwen"))
    assert "no weights" in partial.reason and "hf download acme/tiny-qwen" in partial.fix.render()
    gpt2 = hub_cache_entry(families["gpt2"], tmp_path, "acme/tiny-gpt2")
    assert gpt2.is_dir()
    found = _world(
        _pretrained("acme/tiny-gpt2", "model.max_seq_length=64", "rl.max_prompt_length=16")
    )
    assert problem_about(found, "model.max_seq_length").severity == Severity.error


# ---- lengths in the run's own tokens --------------------------------------------------


def _examples() -> list[Example]:
    return [
        Example(prompt="ab=", answer="ba"),
        Example(prompt="what is 12 + 7?", answer="19"),
        Example(prompt='Say "hi" twice.\nThen stop.', answer="hi hi"),
        Example(
            prompt="hi",
            answer="ok",
            messages=(
                ("system", " Be brief. "),
                ("user", "count to 3"),
                ("assistant", "1 2"),
                ("user", "go on"),
            ),
        ),
    ]


def _transformers_counts(folder: Path, example: Example) -> tuple[int, int]:
    """What the run encodes, by transformers itself: the chat template (or plain text
    with special tokens) for the prompt, the answer without special tokens."""
    from transformers import AutoTokenizer

    tokenizer = AutoTokenizer.from_pretrained(folder)
    if tokenizer.chat_template:
        messages = [{"role": r, "content": c} for r, c in example.messages] or [
            {"role": "user", "content": example.prompt}
        ]
        ids = tokenizer.apply_chat_template(messages, add_generation_prompt=True, tokenize=True)
        prompt = len(ids["input_ids"] if hasattr(ids, "keys") else ids)
    else:
        prompt = len(tokenizer(example.prompt)["input_ids"])
    answer = len(tokenizer(example.answer, add_special_tokens=False)["input_ids"])
    return prompt, answer


@pytest.mark.parametrize("name", ["qwen2", "llama", "gpt2", "gemma", "mistral", "sharded"])
def test_counts_equal_transformers_encoding(families: dict[str, Path], name: str) -> None:
    """With and without a chat template, BOS from the post-processor, from the template,
    from add_bos_token, or none."""
    counter = FolderCounter(load_folder_tokenizer(families[name]), name)
    for example in _examples():
        if example.messages and name in ("gpt2", "mistral"):
            continue  # no template: a conversation cannot be a plain-text prompt
        ours = (counter.prompt(example, None)[0], counter.answer(example.answer or "")[0])
        assert ours == _transformers_counts(families[name], example), (name, example)


def test_tiny_counts_equal_the_character_tokenizer() -> None:
    from art_hydra.engine.backends.tiny import build_tokenizer

    texts = ["ab=", "a\n\nb\nc", "x<eos>y", "\n", "", "a\r\n\tb\x0b\x0cc"]
    tokenizer = build_tokenizer("".join(sorted(set("".join(texts)))))
    counter = TinyCounter()
    for text in texts:
        assert counter.prompt(Example(prompt=text, answer=""), None)[0] == len(
            tokenizer(text)["input_ids"]
        )
        assert counter.answer(text)[0] == len(
            tokenizer(text, add_special_tokens=False)["input_ids"]
        )


def _data(tmp_path: Path, rows: list[dict[str, str]]) -> Path:
    path = tmp_path / "data.jsonl"
    path.write_text("".join(json.dumps(row) + "\n" for row in rows))
    return path


def test_lengths_are_measured_with_the_template_and_fixed_in_one_step(
    families: dict[str, Path], tmp_path: Path
) -> None:
    path = _data(tmp_path, [{"prompt": "ab=", "answer": "ba"}, {"prompt": "x" * 30, "answer": "y"}])
    budgets = ["model.max_seq_length=40", "rl.max_prompt_length=32", "rl.max_completion_length=8"]
    overrides = _pretrained(families["qwen2"], "task=jsonl", f"task.path={path}", *budgets)
    problem = problem_about(_world(overrides), "rl.max_prompt_length")
    expected = _transformers_counts(families["qwen2"], Example(prompt="x" * 30, answer="y"))[0]
    assert f"{path}:2" in problem.reason and f"takes {expected} tokens" in problem.reason
    # The budget and model.max_seq_length together: applying the fix passes.
    assert problem.fix.overrides() == [
        f"rl.max_prompt_length={expected}",
        f"model.max_seq_length={expected + 8}",
    ]
    assert _world([*overrides, *problem.fix.overrides()]) == []
    sft = [*overrides, "algorithm=sft", "sft.max_length=16", "model.max_seq_length=16"]
    fixed = problem_about(_world(sft), "sft.max_length").fix.overrides()
    assert fixed == [f"sft.max_length={expected + 2}", f"model.max_seq_length={expected + 2}"]
    assert _world([*sft, *fixed]) == []


def test_special_token_look_alikes_are_data_problems(
    families: dict[str, Path], tmp_path: Path
) -> None:
    rows = [
        {"prompt": "ab=", "answer": "ba"},
        {"prompt": "stop<|im_end|>here", "answer": "ok"},
        {"prompt": "fine", "answer": "done<|endoftext|>"},
        {"prompt": "fine", "answer": "done<eos>"},
    ]
    path = _data(tmp_path, rows)
    overrides = _pretrained(families["qwen2"], "task=jsonl", f"task.path={path}")
    problem = problem_about(_world(overrides), "task.path")
    assert problem.severity == Severity.error
    assert f"{path}:2" in problem.reason and f"{path}:3" in problem.reason
    assert f"{path}:4" not in problem.reason
    assert "'<|im_end|>'" in problem.reason and "'<|endoftext|>'" in problem.reason
    budgets = ["rl.max_prompt_length=32", "rl.max_completion_length=32"]
    tiny = problem_about(_world(["task=jsonl", f"task.path={path}", *budgets]), "task.path")
    assert f"{path}:4" in tiny.reason and f"{path}:2" not in tiny.reason


def test_characters_the_tokenizer_cannot_encode(families: dict[str, Path], tmp_path: Path) -> None:
    path = _data(tmp_path, [{"prompt": "ab=", "answer": "caf\u00e9"}])
    found = _world(_pretrained(families["sharded"], "task=jsonl", f"task.path={path}"))
    problem = problem_about(found, "task.path")
    assert problem.severity == Severity.error and "cannot encode" in problem.reason
    # Byte-level BPE encodes every character.
    assert _world(_pretrained(families["qwen2"], "task=jsonl", f"task.path={path}")) == []
    # The tiny model's tokenizer makes one <unk> of a run of newlines.
    prompt = _data(tmp_path, [{"prompt": "a\n\nb=", "answer": "ab"}])
    budgets = ["rl.max_prompt_length=32", "rl.max_completion_length=32"]
    warned = problem_about(_world(["task=jsonl", f"task.path={prompt}", *budgets]), "task.path")
    assert warned.severity == Severity.warning and f"{prompt}:1" in warned.reason


# ---- rules that need the folder -------------------------------------------------------


def test_a_head_trained_in_full_on_tied_embeddings_is_a_warning(
    families: dict[str, Path],
) -> None:
    tied = _pretrained(families["llama"], "model.lora.modules_to_save=[lm_head]")
    problem = problem_about(_world(tied), "model.lora.modules_to_save")
    assert problem.severity == Severity.warning
    assert f"{_vocab(families['llama']) * 32:,} parameters" in problem.reason
    assert problem.fix.overrides() == ["model.lora.modules_to_save=[]"]
    untied = _pretrained(families["sharded"], "model.lora.modules_to_save=[lm_head]")
    assert _world(untied) == []


def test_top_p_counts_only_the_tokens_the_sampler_can_draw(families: dict[str, Path]) -> None:
    """digit_sum on the tiny model: 5 characters and EOS can be drawn (pad, BOS and
    unknown never are), so top-p 0.15 surely keeps one token."""
    problem = problem_about(_world(["rl.top_p=0.15"]), "rl.top_p")
    assert problem.severity == Severity.error and "draw 6 tokens" in problem.reason
    assert "rl.top_p" not in {p.key for p in _world(["rl.top_p=0.2"])}
    drawable = _vocab(families["mistral"]) - 3  # pad, BOS, unknown
    edge = f"rl.top_p={1 / drawable}"
    assert problem_about(_world(_pretrained(families["mistral"], edge)), "rl.top_p")
    assert _world(_pretrained(families["mistral"], f"rl.top_p={1.01 / drawable}")) == []


def test_a_chat_template_that_refuses_a_prompt_is_a_data_problem(
    families: dict[str, Path], tmp_path: Path
) -> None:
    """A template's raise_exception (here: no system role) fails apply_chat_template at
    run time; the pre-flight renders every prompt and names the rows."""
    folder = _copy(families, "llama", tmp_path)
    (folder / "chat_template.jinja").write_text(
        "{% for m in messages %}{% if m['role'] == 'system' %}"
        "{{ raise_exception('System role not supported') }}{% endif %}"
        "{{ m['content'] }}{% endfor %}"
    )
    rows = [{"prompt": "ab=", "answer": "ba"}, {"prompt": "cd=", "answer": "dc"}]
    path = _data(tmp_path, rows)
    ok = _pretrained(folder, "task=jsonl", f"task.path={path}")
    assert _world(ok) == []
    lengths = Lengths(FolderCounter(load_folder_tokenizer(folder), str(folder)))
    lengths.add("data.jsonl:1", Example(prompt="ab=", answer="ba"))
    system = (("system", "Be brief."), ("user", "cd="))
    lengths.add("data.jsonl:2", Example(prompt="cd=", answer="dc", messages=system))
    (problem,) = length_problems(compose(ok), lengths, "task.path", str(path))
    assert "System role not supported" in problem.reason and "data.jsonl:2" in problem.reason
    assert "data.jsonl:1" not in problem.reason


@pytest.mark.parametrize(
    ("key", "value", "says"),
    [
        ("intermediate_size", 96, "(intermediate_size, hidden size)"),
        ("num_key_value_heads", 2, "(num_key_value_heads x head_dim, hidden size)"),
        ("num_hidden_layers", 3, "num_hidden_layers=3 (missing layers"),
    ],
)
def test_layer_sizes_that_do_not_match_the_config(
    families: dict[str, Path], tmp_path: Path, key: str, value: int, says: str
) -> None:
    folder = _copy(families, "qwen2", tmp_path)
    config = json.loads((folder / "config.json").read_text())
    (folder / "config.json").write_text(json.dumps({**config, key: value}))
    (reason,) = _reasons(_pretrained(folder))
    assert says in reason and "would not load" in reason


#: Templates in the shape of Qwen2.5's and Llama 3.1's (namespace, tools, loop state,
#: strftime_now, whitespace control), rendered by both sides on the same folder.
QWEN25_LIKE = """{%- if tools %}
    {{- '<|im_start|>system\\n' }}
    {%- if messages[0]['role'] == 'system' %}{{- messages[0]['content'] }}
    {%- else %}{{- 'You are helpful.' }}{%- endif %}
    {%- for tool in tools %}{{- '\\n' }}{{- tool | tojson }}{%- endfor %}
    {{- '<|im_end|>\\n' }}
{%- else %}
    {%- if messages[0]['role'] == 'system' %}
        {{- '<|im_start|>system\\n' + messages[0]['content'] + '<|im_end|>\\n' }}
    {%- else %}
        {{- '<|im_start|>system\\nYou are Qwen, a helpful assistant.<|im_end|>\\n' }}
    {%- endif %}
{%- endif %}
{%- set ns = namespace(turns=0) %}
{%- for message in messages %}
    {%- if (message.role == "user") or (message.role == "system" and not loop.first)
        or (message.role == "assistant") %}
        {%- set ns.turns = ns.turns + 1 %}
        {{- '<|im_start|>' + message.role + '\\n' + message.content + '<|im_end|>' + '\\n' }}
    {%- endif %}
{%- endfor %}
{%- if add_generation_prompt %}
    {{- '<|im_start|>assistant\\n' }}
{%- endif %}
"""
LLAMA31_LIKE = """{{- bos_token }}
{%- if not date_string is defined %}
    {%- set date_string = strftime_now("%d %b %Y") %}
{%- endif %}
{%- if messages[0]['role'] == 'system' %}
    {%- set system_message = messages[0]['content']|trim %}
    {%- set messages = messages[1:] %}
{%- else %}
    {%- set system_message = "" %}
{%- endif %}
{{- "[SYS]\\n\\n" }}
{{- "Today Date: " + date_string + "\\n\\n" }}
{{- system_message }}
{{- "[/SYS]" }}
{%- for message in messages %}
    {{- '[' + message['role'] + ']\\n\\n'+ message['content'] | trim + '<eos>' }}
{%- endfor %}
{%- if add_generation_prompt %}
    {{- '[assistant]\\n\\n' }}
{%- endif %}
"""


@pytest.mark.parametrize("template", [QWEN25_LIKE, LLAMA31_LIKE], ids=["qwen2.5", "llama3.1"])
def test_counts_equal_transformers_on_real_template_shapes(
    families: dict[str, Path], tmp_path: Path, template: str
) -> None:
    folder = _copy(families, "mistral", tmp_path)
    (folder / "chat_template.jinja").write_text(template)
    counter = FolderCounter(load_folder_tokenizer(folder), "mistral")
    for example in _examples():
        ours = (counter.prompt(example, None)[0], counter.answer(example.answer or "")[0])
        assert ours == _transformers_counts(folder, example), example


def test_a_length_fix_never_passes_the_model_positions(
    families: dict[str, Path], tmp_path: Path
) -> None:
    """gpt2 has 32 positions: a 40-character prompt cannot fit whatever the budgets."""
    path = _data(tmp_path, [{"prompt": "x" * 40, "answer": "y"}])
    budgets = ["model.max_seq_length=32", "rl.max_prompt_length=16", "rl.max_completion_length=16"]
    overrides = _pretrained(families["gpt2"], "task=jsonl", f"task.path={path}", *budgets)
    problem = problem_about(_world(overrides), "rl.max_prompt_length")
    assert problem.fix.overrides() == [] and "has 32 positions" in problem.fix.render()


def test_tokenizer_files_that_are_not_regular_files_are_refused_without_blocking(
    families: dict[str, Path], tmp_path: Path
) -> None:
    folder = _copy(families, "qwen2", tmp_path)
    (folder / "tokenizer.json").unlink()
    os.mkfifo(folder / "tokenizer.json")
    (reason,) = _reasons(_pretrained(folder))
    assert "tokenizer.json is a FIFO" in reason


# ---- families the sampler cannot serve ---------------------------------------------------


@pytest.mark.parametrize("model_type", sorted(NO_SAMPLING))
def test_rl_on_a_family_without_a_sampling_cache_is_refused_before_loading(
    families: dict[str, Path], tmp_path: Path, model_type: str
) -> None:
    """RWKV, RecurrentGemma and xLSTM keep their state where the sampler cannot carry it
    between decoding steps: RL is refused from the folder's config.json alone, with SFT
    as the fix; SFT passes."""
    folder = _copy(families, "mistral", tmp_path)
    config = json.loads((folder / "config.json").read_text())
    (folder / "config.json").write_text(json.dumps({**config, "model_type": model_type}))
    problem = problem_about(_world(_pretrained(folder)), "algorithm")
    assert problem.severity == Severity.error and model_type in problem.reason
    assert problem.fix.overrides() == ["algorithm=sft"]
    assert _reasons(_pretrained(folder, "algorithm=sft"), "algorithm") == []


def test_hybrid_families_are_not_refused(families: dict[str, Path], tmp_path: Path) -> None:
    folder = _copy(families, "mistral", tmp_path)
    config = json.loads((folder / "config.json").read_text())
    (folder / "config.json").write_text(json.dumps({**config, "model_type": "falcon_h1"}))
    assert _reasons(_pretrained(folder), "algorithm") == []
