"""Tiny random-weight model folders of real families, saved as a user's would be
(``save_pretrained``), with tokenizers of each family's own class and chat templates of
each family's shape; and the Hugging Face cache layout a hub id is found in. Shared by
the model pre-flight's tests and the README's commands."""

from __future__ import annotations

import os
import shutil
from pathlib import Path
from typing import Any

#: A ChatML template (Qwen's shape): no BOS, the turn markers as special tokens.
CHATML = (
    "{% for m in messages %}<|im_start|>{{ m['role'] }}\n{{ m['content'] }}<|im_end|>\n"
    "{% endfor %}{% if add_generation_prompt %}<|im_start|>assistant\n{% endif %}"
)
#: A Llama-style template that writes BOS itself and uses the loop controls, tojson,
#: raise_exception and the generation block transformers gives templates.
LLAMA_LIKE = (
    "{{ bos_token }}{% for m in messages %}"
    "{% if m['role'] not in ['system', 'user', 'assistant'] %}"
    "{{ raise_exception('bad role') }}{% endif %}"
    "{% if m['role'] == 'system' %}[SYS]{{ m['content'] | trim }}[/SYS]{% continue %}{% endif %}"
    "[{{ m['role'] | upper }}] {{ m['content'] | tojson }}\n"
    "{% endfor %}{% if add_generation_prompt %}{% generation %}[ASSISTANT]{% endgeneration %}"
    "{% endif %}"
)
#: Qwen 2.5's tool template, in shape: the tools' schemas in a system turn, each call
#: as ``<tool_call>`` JSON inside the assistant turn, consecutive tool results grouped in
#: one user turn as ``<tool_response>``s, every turn closed by ``<|im_end|>\n``.
QWEN_TOOLS = (
    "{%- if tools %}{{- '<|im_start|>system\n# Tools\n<tools>' }}"
    "{%- for tool in tools %}{{- '\n' + tool | tojson }}{%- endfor %}"
    "{{- '\n</tools><|im_end|>\n' }}{%- endif %}"
    "{%- for message in messages %}"
    "{%- if message.role == 'user' or message.role == 'system' or "
    "(message.role == 'assistant' and not message.tool_calls) %}"
    "{{- '<|im_start|>' + message.role + '\n' + message.content + '<|im_end|>\n' }}"
    "{%- elif message.role == 'assistant' %}"
    "{{- '<|im_start|>' + message.role }}"
    "{%- if message.content %}{{- '\n' + message.content }}{%- endif %}"
    "{%- for tool_call in message.tool_calls %}"
    "{%- if tool_call.function is defined %}{%- set tool_call = tool_call.function %}{%- endif %}"
    '{{- \'\n<tool_call>\n{"name": "\' + tool_call.name + \'", "arguments": \' }}'
    "{{- tool_call.arguments | tojson }}{{- '}\n</tool_call>' }}"
    "{%- endfor %}{{- '<|im_end|>\n' }}"
    "{%- elif message.role == 'tool' %}"
    "{%- if loop.index0 == 0 or messages[loop.index0 - 1].role != 'tool' %}"
    "{{- '<|im_start|>user' }}{%- endif %}"
    "{{- '\n<tool_response>\n' + message.content + '\n</tool_response>' }}"
    "{%- if loop.last or messages[loop.index0 + 1].role != 'tool' %}{{- '<|im_end|>\n' }}"
    "{%- endif %}{%- endif %}{%- endfor %}"
    "{%- if add_generation_prompt %}{{- '<|im_start|>assistant\n' }}{%- endif %}"
)
SPECIALS = ["<pad>", "<bos>", "<eos>", "<unk>", "<|im_start|>", "<|im_end|>"]
CHARS = "abcdefghijklmnopqrstuvwxyzABCDEFGHIJKLMNOPQRSTUVWXYZ =+-*/0123456789\n[]\"'.,:?!_|<>{}"
SMALL = {"hidden_size": 32, "intermediate_size": 64, "num_hidden_layers": 1}
HEADS = {"num_attention_heads": 2, "num_key_value_heads": 1, "head_dim": 16}


def char_tokenizer(
    folder: Path,
    template: str | None = None,
    bos_post: bool = True,
    eos: str | None = "<eos>",
    pad: str | None = "<pad>",
) -> int:
    """A character tokenizer saved by transformers (``TokenizersBackend``), with the turn
    markers as special tokens; BOS added by the post-processor or not, EOS and pad named
    or not. Returns its size."""
    from tokenizers import Regex, Tokenizer, decoders, models, pre_tokenizers, processors
    from transformers import PreTrainedTokenizerFast

    vocab = {token: i for i, token in enumerate(SPECIALS)}
    for ch in CHARS:
        vocab.setdefault(ch, len(vocab))
    core = Tokenizer(models.WordLevel(vocab=vocab, unk_token="<unk>"))
    core.pre_tokenizer = pre_tokenizers.Split(Regex("."), behavior="isolated")
    core.decoder = decoders.Fuse()
    if bos_post:
        core.post_processor = processors.TemplateProcessing(
            single="<bos> $A", special_tokens=[("<bos>", vocab["<bos>"])]
        )
    tokenizer = PreTrainedTokenizerFast(
        tokenizer_object=core,
        bos_token="<bos>",
        unk_token="<unk>",
        eos_token=eos,
        pad_token=pad,
        additional_special_tokens=["<|im_start|>", "<|im_end|>"],
    )
    if template:
        tokenizer.chat_template = template
    tokenizer.save_pretrained(folder)
    return len(tokenizer)


def qwen_tokenizer(folder: Path) -> int:
    """Qwen's own tokenizer class (byte-level BPE, no merges) with its turn markers and
    ChatML: what AutoTokenizer builds for model_type qwen2 whatever the folder says."""
    from tokenizers import pre_tokenizers
    from transformers import Qwen2Tokenizer

    alphabet = sorted(pre_tokenizers.ByteLevel.alphabet())
    vocab = {c: i for i, c in enumerate(["<|endoftext|>", *alphabet])}
    tokenizer = Qwen2Tokenizer(
        vocab=vocab, merges=[], unk_token=None, eos_token="<|im_end|>", pad_token="<|endoftext|>"
    )
    tokenizer.add_special_tokens({"additional_special_tokens": ["<|im_start|>", "<|im_end|>"]})
    tokenizer.chat_template = CHATML
    tokenizer.save_pretrained(folder)
    return len(tokenizer)


def gpt2_tokenizer(folder: Path) -> int:
    from tokenizers import pre_tokenizers
    from transformers import GPT2Tokenizer

    alphabet = sorted(pre_tokenizers.ByteLevel.alphabet())
    vocab = {c: i for i, c in enumerate(["<|endoftext|>", *alphabet])}
    tokenizer = GPT2Tokenizer(vocab=vocab, merges=[])
    tokenizer.save_pretrained(folder)
    return len(tokenizer)


def sentencepiece_style(folder: Path, cls: str, template: str) -> int:
    """Llama's or Gemma's own class: metaspace BPE with byte fallback, BOS by the
    post-processor and (Llama) by the template too."""
    import transformers

    pieces = [
        "<unk>",
        "<s>",
        "</s>",
        "<pad>",
        "<bos>",
        "<eos>",
        "\u2581",
        *"abcdefghijklmnopqrstuvwxyz",
    ]
    pieces += [*"=+0123456789?", *(f"<0x{b:02X}>" for b in range(256))]
    vocab = {piece: i for i, piece in enumerate(dict.fromkeys(pieces))}
    tokenizer = getattr(transformers, cls)(vocab=vocab, merges=[])
    tokenizer.chat_template = template
    tokenizer.save_pretrained(folder)
    return len(tokenizer)


def random_model(
    folder: Path, model_type: str, vocab: int, shard: str | None = None, **extra: Any
) -> None:
    """Random weights of a real family, tiny, saved with save_pretrained."""
    import torch
    from transformers import AutoConfig, AutoModelForCausalLM

    if model_type == "gpt2":
        sizes: dict[str, Any] = {"n_embd": 32, "n_layer": 1, "n_head": 2}
    else:
        sizes = {**SMALL, **HEADS}
    ids = {"bos_token_id": 1, "eos_token_id": 2, "pad_token_id": 0}
    config = AutoConfig.for_model(model_type, vocab_size=vocab, **sizes, **ids, **extra)
    torch.manual_seed(0)
    model = AutoModelForCausalLM.from_config(config)
    model.save_pretrained(folder, **({"max_shard_size": shard} if shard else {}))


#: A Gemma-style template: BOS written by the template, turns as plain text.
GEMMA_LIKE = (
    "{{ bos_token }}{% for m in messages %}<start_of_turn>{{ m['role'] }}\n"
    "{{ m['content'] | trim }}<end_of_turn>\n{% endfor %}"
    "{% if add_generation_prompt %}<start_of_turn>model\n{% endif %}"
)


def hub_cache_entry(folder: Path, hf_home: Path, repo: str) -> Path:
    """The hub cache's layout: blobs, a snapshot of links to them, refs/main."""
    root = hf_home / "hub" / f"models--{repo.replace('/', '--')}"
    snapshot = root / "snapshots" / "0123abcd"
    snapshot.mkdir(parents=True)
    (root / "blobs").mkdir()
    for i, path in enumerate(sorted(folder.iterdir())):
        blob = root / "blobs" / f"blob{i}"
        shutil.copy(path, blob)
        (snapshot / path.name).symlink_to(os.path.relpath(blob, snapshot))
    (root / "refs").mkdir()
    (root / "refs" / "main").write_text("0123abcd")
    return snapshot


def chatml_model(folder: Path) -> Path:
    """A tiny Qwen2-family folder with Qwen's tokenizer class and a ChatML template."""
    random_model(folder, "qwen2", qwen_tokenizer(folder))
    return folder
