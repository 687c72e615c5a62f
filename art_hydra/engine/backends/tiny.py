"""The tiny model and its character-level tokenizer, built locally from config and seed.

No hub access: a run with ``model=tiny`` works on a machine that has never downloaded a
model, and tests use it. The tokenizer is a ``PreTrainedTokenizerFast`` so it saves and
loads like any Hugging Face tokenizer.
"""

from __future__ import annotations

import string
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    from art_hydra.config.schema import ModelConfig

#: Special tokens, in id order.
SPECIALS = ["<pad>", "<bos>", "<eos>", "<unk>"]
#: Default vocabulary: every printable ASCII character.
CHARSET = string.printable[:95]


def build_tokenizer(charset: str | None = None) -> Any:
    """A character-level tokenizer: one id per character of ``charset``, BOS prepended.

    A toy task's own characters make a small vocabulary, so a fresh model starts with a
    real chance of sampling a right answer.
    """
    from tokenizers import Regex, Tokenizer, decoders, models, pre_tokenizers, processors
    from transformers import PreTrainedTokenizerFast

    vocab = {tok: i for i, tok in enumerate(SPECIALS)}
    for ch in charset or CHARSET:
        vocab.setdefault(ch, len(vocab))
    core = Tokenizer(models.WordLevel(vocab=vocab, unk_token="<unk>"))
    core.pre_tokenizer = pre_tokenizers.Split(Regex("."), behavior="isolated")
    core.decoder = decoders.Fuse()
    core.post_processor = processors.TemplateProcessing(
        single="<bos> $A", special_tokens=[("<bos>", vocab["<bos>"])]
    )
    return PreTrainedTokenizerFast(
        tokenizer_object=core,
        pad_token="<pad>",
        bos_token="<bos>",
        eos_token="<eos>",
        unk_token="<unk>",
        padding_side="left",
    )


def build_model(model_cfg: ModelConfig, tokenizer: Any, seed: int) -> Any:
    """A randomly initialised Llama of the shape in ``model.tiny``, same weights per seed."""
    import torch
    from transformers import LlamaConfig, LlamaForCausalLM

    tiny = model_cfg.tiny
    config = LlamaConfig(
        vocab_size=len(tokenizer),
        hidden_size=tiny.hidden_size,
        num_hidden_layers=tiny.num_layers,
        num_attention_heads=tiny.num_heads,
        num_key_value_heads=tiny.num_heads,
        intermediate_size=tiny.intermediate_size,
        max_position_embeddings=model_cfg.max_seq_length,
        initializer_range=tiny.init_std,
        # A separate head, so LoRA runs can train it whole (modules_to_save=[lm_head]).
        tie_word_embeddings=False,
        pad_token_id=tokenizer.pad_token_id,
        bos_token_id=tokenizer.bos_token_id,
        eos_token_id=tokenizer.eos_token_id,
    )
    devices = []
    with torch.random.fork_rng(devices=devices):
        torch.manual_seed(seed)
        model = LlamaForCausalLM(config)
    return model
