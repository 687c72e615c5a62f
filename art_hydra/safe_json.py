"""JSON a user (or anyone with write access to a run folder) could have written, read
within bounds.

Python's ``json`` recurses once per nesting level, so a line of 30,000 ``[`` raises
``RecursionError`` from inside the parser; and a ``"\\ud800"`` escape decodes to a lone
UTF-16 surrogate, a ``str`` that no UTF-8 encoder (tokenizer, file name, log) accepts.
Here the nesting depth is measured before parsing (a linear scan outside strings), every
string of the result is checked for text that cannot be encoded, and a file is read
only when it is a regular file within a size bound. Plain Python: the pre-flight
imports this.
"""

from __future__ import annotations

import json
import os
import re
from typing import Any

from hydra.errors import CompactHydraException

from art_hydra.safe_paths import RefusedFile, open_regular

#: The deepest nesting accepted: tasks, manifests and checkpoint state need a few levels.
MAX_DEPTH = 64
#: The largest JSON file read whole (a model's config.json, a checkpoint's manifest or
#: state are kilobytes to a few megabytes).
MAX_FILE_BYTES = 64 << 20

#: A JSON string (an unterminated one runs to the end) or a bracket outside strings.
_TOKENS = re.compile(r'"[^"\\]*(?:\\.[^"\\]*)*(?:"|$)|[\[\]{}]', re.DOTALL)


class JsonRefused(CompactHydraException, ValueError):
    """JSON that is refused before or after parsing; the message names the file."""


def depth_refusal(text: str, limit: int = MAX_DEPTH) -> str | None:
    """Why ``text`` nests too deep to parse (None: it does not), without parsing it."""
    if text.count("[") + text.count("{") <= limit:
        return None  # the common case: too few brackets to nest that deep
    depth = 0
    for match in _TOKENS.finditer(text):
        token = match.group()
        if token in "[{":
            depth += 1
            if depth > limit:
                return f"nested deeper than {limit} levels (at column {match.start() + 1})"
        elif token in "]}":
            depth -= 1
    return None


def unencodable(value: Any, where: str = "") -> str | None:
    """Why a string in parsed JSON ``value`` is not text (None: every string is): a lone
    surrogate escape (``"\\ud800"``) decodes to a ``str`` that UTF-8 cannot encode.
    ``where`` is the value's place (``prompt``, ``meta.tags[2]``); the recursion is
    bounded by the depth checked before parsing."""
    if isinstance(value, str):
        try:
            value.encode("utf-8")
        except UnicodeEncodeError as exc:
            return (
                f"the string {repr(where) if where else 'value'} holds "
                f"\\u{ord(value[exc.start]):04x} "
                f"(character {exc.start + 1}), a lone UTF-16 surrogate, which is not text"
            )
        return None
    if isinstance(value, list):
        children = [(f"{where}[{i}]", item) for i, item in enumerate(value)]
    elif isinstance(value, dict):
        children = []
        for key, item in value.items():
            place = f"{where}.{key}" if where else str(key)
            if isinstance(key, str) and unencodable(key) is not None:
                inside = repr(where) if where else "the object"
                return f"a key in {inside} holds a lone UTF-16 surrogate, which is not text"
            children.append((place, item))
    else:
        return None
    for place, item in children:
        found = unencodable(item, place)
        if found is not None:
            return found
    return None


def loads(text: str, *, max_depth: int = MAX_DEPTH, **options: Any) -> Any:
    """``json.loads(text, **options)``, with the nesting depth bounded before parsing and
    every string checked; refusals raise ``ValueError`` (:class:`JsonRefused`)."""
    refusal = depth_refusal(text, max_depth)
    if refusal is not None:
        raise JsonRefused(refusal)
    value = json.loads(text, **options)
    # Valid UTF-8 decodes to no surrogate: only a \\udXXX escape can put one in a string.
    refusal = unencodable(value) if "\\ud" in text.lower() else None
    if refusal is not None:
        raise JsonRefused(refusal)
    return value


def read(
    path: str | os.PathLike, *, max_bytes: int = MAX_FILE_BYTES, max_depth: int = MAX_DEPTH
) -> Any:
    """The JSON in the regular file ``path``; anything else (not a regular file, over
    ``max_bytes``, not UTF-8, too deep, not JSON, not text) raises :class:`JsonRefused`
    naming the file."""
    try:
        with open_regular(path) as handle:
            raw = handle.read(max_bytes + 1)
    except RefusedFile as exc:
        raise JsonRefused(str(exc)) from exc
    except OSError as exc:
        raise JsonRefused(f"{os.fspath(path)} cannot be read: {exc.strerror or exc}") from exc
    if len(raw) > max_bytes:
        raise JsonRefused(f"{os.fspath(path)} is larger than {max_bytes:,} bytes")
    try:
        return loads(raw.decode("utf-8"), max_depth=max_depth)
    except ValueError as exc:  # UnicodeDecodeError, JSONDecodeError, JsonRefused
        raise JsonRefused(f"{os.fspath(path)} is not usable JSON: {exc}") from exc
