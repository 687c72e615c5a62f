"""The vLLM stage's model folders (tests/vllm_stage): a tiny llama, built here and read
by vLLM as by transformers. A module of its own, not a conftest: a second ``conftest``
module would shadow tests/conftest.py for the tests that import helpers from it."""

from __future__ import annotations

from pathlib import Path

#: Every character the tiny model can read or write: the shipped tasks' prompts and
#: answers (task=reverse: letters and "="; digit_sum: digits, "+") and common punctuation.
CHARACTERS = "abcdefghijklmnopqrstuvwxyz0123456789 =+-.,:;!?"
SPECIALS = ("<pad>", "<s>", "</s>", "<unk>")


def build_tiny_llama(
    folder: Path,
    head_dim: int = 32,
    positions: int = 128,
    tied: bool = False,
    family: str = "llama",
) -> Path:
    """A randomly initialised two-layer llama and a one-token-per-character tokenizer,
    saved as from_pretrained reads them. Head size 32 by default: vLLM's CPU attention
    refuses smaller heads. Untied embeddings by default, so lm_head is a module of its
    own (LoRA's modules_to_save may train it). ``family``: another transformers model type
    of the same shape (qwen2: biases on q, k and v, fused into one layer by vLLM)."""
    import torch
    from tokenizers import Tokenizer, decoders, models, pre_tokenizers
    from transformers import AutoConfig, AutoModelForCausalLM, PreTrainedTokenizerFast

    vocab = {token: index for index, token in enumerate((*SPECIALS, *CHARACTERS))}
    words = Tokenizer(models.WordLevel(vocab, unk_token="<unk>"))
    words.pre_tokenizer = pre_tokenizers.Split("", "isolated")  # every character alone
    words.decoder = decoders.Fuse()  # and back without spaces between them
    tokenizer = PreTrainedTokenizerFast(
        tokenizer_object=words,
        pad_token="<pad>",
        bos_token="<s>",
        eos_token="</s>",
        unk_token="<unk>",
        padding_side="left",
    )
    config = AutoConfig.for_model(
        family,
        vocab_size=64,
        hidden_size=2 * head_dim,
        intermediate_size=128,
        num_hidden_layers=2,
        num_attention_heads=2,
        num_key_value_heads=1,
        head_dim=head_dim,
        max_position_embeddings=positions,
        tie_word_embeddings=tied,
        pad_token_id=vocab["<pad>"],
        bos_token_id=vocab["<s>"],
        eos_token_id=vocab["</s>"],
    )
    assert len(vocab) <= config.vocab_size
    torch.manual_seed(0)
    AutoModelForCausalLM.from_config(config).save_pretrained(folder)
    tokenizer.save_pretrained(folder)
    return folder
