"""Chat templates art_hydra ships, and ``model.chat_template`` read as data.

``model.chat_template`` is the name of a template shipped here (``tools``: the tiny
model's tool-call template, ``art_hydra/templates/tools.jinja``) or the path of a
``.jinja`` file (TRL's ``chat_template_path``). Either way it is text handed to the
tokenizer's jinja sandbox, never code: the file must be a regular file within
:data:`MAX_BYTES`. The pre-flight reports what :func:`template_refusal` says; the run
sets ``tokenizer.chat_template = load_chat_template(value)``. Nothing here imports torch.
"""

from __future__ import annotations

import importlib.resources
import os
import re

from art_hydra.safe_paths import file_refusal, open_regular

#: The largest template file read (real templates are a few kilobytes; Qwen3's ~4 KiB).
MAX_BYTES = 1 << 20
#: What a shipped template's name looks like (anything else is a path).
_NAME = re.compile(r"^[A-Za-z0-9_-]+$")


class ChatTemplateError(ValueError):
    """A ``model.chat_template`` that cannot be read; the message says why."""


def shipped_names() -> tuple[str, ...]:
    """The names of the templates shipped in this package (``tools``, ...)."""
    folder = importlib.resources.files(__name__)
    return tuple(
        sorted(p.name[: -len(".jinja")] for p in folder.iterdir() if p.name.endswith(".jinja"))
    )


def is_shipped_name(value: str) -> bool:
    """Whether ``value`` is spelt as a shipped template's name rather than a path."""
    return bool(_NAME.match(value)) and not value.endswith(".jinja")


def load_chat_template(value: str) -> str:
    """The template text ``model.chat_template`` names: a shipped template by name, or a
    ``.jinja`` file's text; :class:`ChatTemplateError` when it cannot be read."""
    if is_shipped_name(value):
        names = shipped_names()
        if value not in names:
            raise ChatTemplateError(
                f"names no template shipped with art_hydra (shipped: {', '.join(names) or 'none'})"
                " and is not a path to a .jinja file"
            )
        return (importlib.resources.files(__name__) / f"{value}.jinja").read_text("utf-8")
    path = os.path.expanduser(value)
    refusal = file_refusal(path)
    if refusal is not None:
        raise ChatTemplateError(f"{refusal}; a chat template is a regular .jinja file")
    try:
        with open_regular(path) as handle:
            raw = handle.read(MAX_BYTES + 1)
    except OSError as exc:
        raise ChatTemplateError(f"cannot be read ({exc.strerror or exc})") from exc
    if len(raw) > MAX_BYTES:
        raise ChatTemplateError(
            f"is larger than {MAX_BYTES:,} bytes (real chat templates are a few kilobytes)"
        )
    try:
        return raw.decode("utf-8")
    except UnicodeDecodeError as exc:
        raise ChatTemplateError(f"is not UTF-8 text ({exc.reason})") from exc


def template_refusal(value: str | None) -> str | None:
    """Why ``model.chat_template=value`` cannot be used (None: it can, or it is unset)."""
    if not value:
        return None
    try:
        load_chat_template(str(value))
    except ChatTemplateError as exc:
        return str(exc)
    return None
