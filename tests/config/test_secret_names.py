"""Which key names are taken for secrets: a token or password is hidden in records, a
tokenizer's special token or a sort key is not (hiding those would blank real settings)."""

from __future__ import annotations

import pytest

from art_hydra.config.secrets import is_secret_key

pytestmark = pytest.mark.fast

SECRETS = [
    "api_key", "openai_api_key", "hf_token", "HF_TOKEN", "access_token", "githubToken",
    "password", "db_password", "secret_key", "auth_header", "key", "task.params.session_token",
]  # fmt: skip
PUBLIC = [
    "max_tokens", "tokenizer", "pad_token", "eos_token", "bos_token", "pad_token_id",
    "sort_key", "key_file", "author", "monkey", "keep_last", "max_completion_length",
]  # fmt: skip


@pytest.mark.parametrize("name", SECRETS)
def test_names_that_hold_secrets_are_hidden(name: str) -> None:
    assert is_secret_key(name)


@pytest.mark.parametrize("name", PUBLIC)
def test_names_that_say_something_about_tokens_are_not(name: str) -> None:
    assert not is_secret_key(name)
