"""A model folder's tokenizer and chat template, without transformers (or torch).

The pre-flight must count prompt tokens exactly as the run will (the run encodes with
transformers' ``AutoTokenizer``) before any model loads, so this mirrors what
transformers 5 does with the same files: ``tokenizer.json`` through the ``tokenizers``
library (its post-processor decides the special tokens added to plain text:
transformers ignores ``add_bos_token`` beside a tokenizer.json), the named special
tokens of ``tokenizer_config.json``, and the chat template rendered in jinja2's
immutable sandbox with the globals and filters ``apply_chat_template`` gives it, the
rendered text then encoded without special tokens. Tests compare the counts with
transformers' own encoding on tiny folders.
"""

from __future__ import annotations

import contextlib
import functools
import json
from collections.abc import Sequence
from dataclasses import dataclass, field
from datetime import datetime
from pathlib import Path
from typing import Any

from art_hydra.model_files import FolderError, read_json_file
from art_hydra.safe_paths import file_refusal

#: transformers' named special tokens (``SPECIAL_TOKENS_ATTRIBUTES``), passed to the
#: chat template as variables.
NAMED_SPECIALS = (
    "bos_token",
    "eos_token",
    "unk_token",
    "sep_token",
    "pad_token",
    "cls_token",
    "mask_token",
)
#: Where a folder keeps its chat template, newest layout first.
TEMPLATE_FILES = ("chat_template.jinja", "chat_template.json")


def _content(value: Any) -> str | None:
    """A special token as tokenizer_config.json spells it: a string or an AddedToken dict."""
    if isinstance(value, dict):
        value = value.get("content")
    return value if isinstance(value, str) and value else None


@dataclass
class FolderTokenizer:
    """The folder's tokenizer, as the run's ``AutoTokenizer`` will encode."""

    core: Any  # tokenizers.Tokenizer
    config: dict[str, Any]
    specials: dict[str, str]
    chat_template: str | None
    #: Every added token's text (special or not), which the tokenizer matches literally.
    added: tuple[str, ...] = field(default_factory=tuple)

    def token_id(self, name: str) -> int | None:
        """The id of a named special token (``eos_token``), or None."""
        token = self.specials.get(name)
        return None if token is None else self.core.token_to_id(token)

    def __len__(self) -> int:
        return int(self.core.get_vocab_size(with_added_tokens=True))

    def encode(self, text: str, add_special_tokens: bool) -> list[int]:
        return list(self.core.encode(text, add_special_tokens=add_special_tokens).ids)

    def render(self, messages: Sequence[tuple[str, str]]) -> str:
        """The chat template applied to ``messages`` with the generation prompt."""
        assert self.chat_template is not None
        template = _compiled(self.chat_template)
        chat = [{"role": role, "content": content} for role, content in messages]
        return template.render(
            messages=chat,
            tools=None,
            documents=None,
            add_generation_prompt=True,
            **self.specials,
        )

    def prompt_ids(self, messages: Sequence[tuple[str, str]], text: str) -> list[int]:
        """A prompt's ids as the run encodes it: the chat template over ``messages`` when
        the tokenizer has one (rendered text, no special tokens added), else ``text``
        with the special tokens the post-processor adds."""
        if self.chat_template:
            return self.encode(self.render(messages), add_special_tokens=False)
        return self.encode(text, add_special_tokens=True)

    def unknown_id(self) -> int | None:
        """The id text the tokenizer cannot encode becomes (None: it has none)."""
        unk = self.token_id("unk_token")
        if unk is None:
            name = getattr(self.core.model, "unk_token", None)
            unk = self.core.token_to_id(name) if isinstance(name, str) else None
        return unk


@functools.lru_cache(maxsize=8)
def _compiled(template: str) -> Any:
    """The template compiled once (compiling took milliseconds per row)."""
    return _environment().from_string(template)


_ENV: list[Any] = []


def _environment() -> Any:
    """jinja2's immutable sandbox set up as transformers sets it up for chat templates."""
    if _ENV:
        return _ENV[0]
    import jinja2
    import jinja2.ext
    from jinja2.sandbox import ImmutableSandboxedEnvironment

    class Generation(jinja2.ext.Extension):
        """``{% generation %}`` blocks render their body (transformers tracks them for
        assistant masks; the text is the same)."""

        tags = {"generation"}

        def parse(self, parser: Any) -> Any:
            lineno = next(parser.stream).lineno
            body = parser.parse_statements(("name:endgeneration",), drop_needle=True)
            call = self.call_method("_body")
            return jinja2.nodes.CallBlock(call, [], [], body).set_lineno(lineno)

        def _body(self, caller: Any) -> str:
            return caller()

    def raise_exception(message: str) -> None:
        raise jinja2.exceptions.TemplateError(message)

    def tojson(
        x: Any,
        ensure_ascii: bool = False,
        indent: int | None = None,
        separators: Any = None,
        sort_keys: bool = False,
    ) -> str:
        return json.dumps(
            x, ensure_ascii=ensure_ascii, indent=indent, separators=separators, sort_keys=sort_keys
        )

    env = ImmutableSandboxedEnvironment(
        trim_blocks=True, lstrip_blocks=True, extensions=[Generation, jinja2.ext.loopcontrols]
    )
    env.filters["tojson"] = tojson
    env.globals["raise_exception"] = raise_exception
    env.globals["strftime_now"] = lambda fmt: datetime.now().strftime(fmt)
    env.globals["dict"] = dict
    _ENV.append(env)
    return env


def has_tokenizer_files(folder: Path) -> str | None:
    """Which kind of tokenizer files the folder holds: ``json`` (tokenizer.json, what the
    pre-flight reads), ``sentencepiece`` (only tokenizer.model), or None."""
    if (folder / "tokenizer.json").exists():
        return "json"
    if (folder / "tokenizer.model").exists() or (folder / "spiece.model").exists():
        return "sentencepiece"
    if (folder / "vocab.json").exists() and (folder / "merges.txt").exists():
        return "bpe-files"
    return None


def load(folder: Path) -> FolderTokenizer:
    """The folder's ``tokenizer.json`` with its config; :class:`FolderError` naming the
    file when it cannot be read."""
    from tokenizers import AddedToken, Tokenizer

    refusal = file_refusal(folder / "tokenizer.json")
    if refusal is not None:  # a FIFO would block the loader for ever
        raise FolderError(f"tokenizer.json {refusal}")
    try:
        core = Tokenizer.from_file(str(folder / "tokenizer.json"))
    except Exception as exc:  # the Rust loader raises plain Exception on a bad file
        raise FolderError(f"tokenizer.json cannot be loaded ({exc})") from exc
    config: dict[str, Any] = {}
    if (folder / "tokenizer_config.json").exists():
        loaded = read_json_file(folder / "tokenizer_config.json")
        if not isinstance(loaded, dict):
            raise FolderError("tokenizer_config.json is not a JSON object")
        config = loaded
    specials = _specials(folder, config)
    _add_config_tokens(core, config, AddedToken)
    core.encode_special_tokens = bool(config.get("split_special_tokens", False))
    # With a tokenizer.json, transformers drops add_bos_token/add_eos_token from the
    # config: its post-processor alone decides (none: nothing added).
    added = tuple(str(t.content) for t in core.get_added_tokens_decoder().values())
    return FolderTokenizer(core, config, specials, chat_template(folder, config), added)


def _specials(folder: Path, config: dict[str, Any]) -> dict[str, str]:
    """The named special tokens: tokenizer_config.json, then special_tokens_map.json."""
    found = {name: _content(config.get(name)) for name in NAMED_SPECIALS}
    if (folder / "special_tokens_map.json").exists() and None in found.values():
        mapped = read_json_file(folder / "special_tokens_map.json")
        if isinstance(mapped, dict):
            for name in NAMED_SPECIALS:
                found[name] = found[name] or _content(mapped.get(name))
    return {name: value for name, value in found.items() if value is not None}


def _add_config_tokens(core: Any, config: dict[str, Any], added_token: Any) -> None:
    """The ``added_tokens_decoder`` entries tokenizer.json lacks, added as transformers does."""
    decoder = config.get("added_tokens_decoder")
    if not isinstance(decoder, dict):
        return
    have = {str(t.content) for t in core.get_added_tokens_decoder().values()}
    for entry in decoder.values():
        content = _content(entry)
        if content is None or content in have:
            continue
        token = added_token(content, special=bool(entry.get("special", False)))
        if entry.get("special", False):
            core.add_special_tokens([token])
        else:
            core.add_tokens([token])


def chat_template(folder: Path, config: dict[str, Any]) -> str | None:
    """The default chat template: chat_template.jinja, chat_template.json, or the
    tokenizer_config.json entry (a string, or a list of named templates)."""
    path = folder / TEMPLATE_FILES[0]
    if path.is_file():
        try:
            return path.read_text(encoding="utf-8")
        except (OSError, ValueError) as exc:
            raise FolderError(f"{path.name} cannot be read ({exc})") from exc
    value: Any = config.get("chat_template")
    if (folder / TEMPLATE_FILES[1]).is_file():
        loaded = read_json_file(folder / TEMPLATE_FILES[1])
        value = loaded.get("chat_template") if isinstance(loaded, dict) else None
    if isinstance(value, list):
        named = {t.get("name"): t.get("template") for t in value if isinstance(t, dict)}
        value = named.get("default")
    return value if isinstance(value, str) and value else None


def _first_id(value: Any) -> int | None:
    if isinstance(value, list) and value:
        value = value[0]
    return value if isinstance(value, int) and not isinstance(value, bool) else None


def eos_token(
    tokenizer: FolderTokenizer, folder: Path, config: dict[str, Any]
) -> tuple[str, str] | None:
    """The EOS token and where it comes from: the tokenizer's own ``eos_token``, else
    ``eos_token_id`` of generation_config.json, then of config.json (the torch backend
    takes the same one at load); None when none names a token of the vocabulary."""
    own = tokenizer.specials.get("eos_token")
    if own is not None:
        return own, "tokenizer_config.json"
    sources: list[tuple[str, Any]] = []
    if (folder / "generation_config.json").is_file():
        with contextlib.suppress(FolderError):
            generation = read_json_file(folder / "generation_config.json")
            sources.append(("generation_config.json", generation))
    sources.append(("config.json", config))
    for name, data in sources:
        parts = [data, data.get("text_config")] if isinstance(data, dict) else []
        for part in parts:
            token_id = _first_id(part.get("eos_token_id")) if isinstance(part, dict) else None
            token = None if token_id is None else tokenizer.core.id_to_token(token_id)
            if token is not None:
                return token, f"{name} eos_token_id={token_id}"
    return None
