"""What a run's records may show of a secret: its expression, or ``***``, never its value.

A config may read a token from the environment (``${oc.env:MY_API_TOKEN}``), and an
experiment file from elsewhere may do so on purpose, to have the value written where it
can be read later: ``run_config.yaml``, the log, the trackers' files, ``result.json``.
Every writer of a record goes through this module:

- :func:`remember` notes, from the config as composed (before anything resolved it),
  which values read the environment: their expression is what ``run_config.yaml``
  keeps (:func:`recorded_container`; a resume compares expressions, so a rotated token
  still resumes, and reading the file back resolves the variable again), and what the
  log and the trackers show (:func:`redacted`).
- a key whose name looks like a secret's (:func:`is_secret_key`: ``api_key``,
  ``hf_token``, ``password``...) is shown as ``***`` in the log and the trackers even
  when its value was written out literally.
- the values themselves (a secret-looking variable's or key's, at least
  :data:`MIN_SECRET_LENGTH` characters; any other variable's the config reads that is
  long and opaque, since a secret hides behind any name: ``DATABASE_URL``) are replaced
  by ``***`` wherever else they would land: a log line naming a task whose name is the
  token (:func:`scrubbing_logs`), a completion, a metric's name, ``result.json``, the
  run's identity record (:func:`scrub`, :func:`scrub_data`).

Import-light (omegaconf only): it sits on the compose/validate path.
"""

from __future__ import annotations

import contextlib
import logging
import os
import re
from collections.abc import Iterator
from typing import Any

#: What a record shows in place of a secret's value.
SHOWN = "***"

#: A value shorter than this is never scrubbed out of text: ``***`` in place of every
#: ``1234`` in a log would hide more than it protects.
MIN_SECRET_LENGTH = 6

#: A value read from a variable with a plain name is scrubbed from text from this length
#: on (a path that exists and a number never are).
MIN_OPAQUE_LENGTH = 12

#: Words of a key's or variable's name that mark it as holding a secret (whole words of
#: the name split at ``_``, ``-``, ``.`` and camelCase: ``max_tokens`` and ``author``
#: are not secrets, ``hf_token``, ``apiKey`` and ``AWS_SECRET_ACCESS_KEY`` are).
SECRET_WORDS = frozenset(
    {
        "token",
        "secret",
        "password",
        "passwd",
        "passphrase",
        "credential",
        "credentials",
        "auth",
        "authorization",
        "apikey",
        "key",
        "privatekey",
        "cookie",
        "dsn",
    }
)

#: A name's single word that ends like a secret's (``hftoken``, ``dbpassword``).
_SECRET_ENDINGS = ("token", "secret", "password", "apikey")

#: A name's last word that says it holds something about a secret, not the secret
#: (``pad_token_id``, ``max_token_count``, ``key_file``).
_NOT_THE_SECRET = frozenset(
    {"id", "ids", "count", "length", "len", "limit", "size", "type", "file", "path", "dir"}
)

#: Words before ``token``/``key`` that name something public: a tokenizer's special
#: tokens (``pad_token``, ``eos_token``) and keys that order or look up (``sort_key``).
_NAMED_NOT_SECRET = frozenset(
    {"pad", "eos", "bos", "unk", "sep", "cls", "mask", "special", "start", "end", "stop",
     "sort", "cache", "group", "dict", "primary", "foreign", "column", "answer", "prompt"}
)  # fmt: skip

#: ``${oc.env:NAME...}``: the variable an expression reads.
_ENV_NAME = re.compile(r"\$\{\s*oc\.env\s*:\s*['\"]?([^,'\"}\s]+)")

#: The top-level node Hydra keeps its own settings in (never part of a run's record).
_HYDRA = "hydra"

Path = tuple[Any, ...]

#: This process's run: expression by leaf path, and the secret values to scrub.
_expressions: dict[Path, str] = {}
_values: list[str] = []


def is_secret_key(name: str) -> bool:
    """Whether a key or variable named ``name`` (its last dotted part) looks like it
    holds a secret."""
    last = str(name).rsplit(".", 1)[-1]
    spaced = re.sub(r"([a-z0-9])([A-Z])", r"\1_\2", last).lower()
    words = [w for w in re.split(r"[^a-z0-9]+", spaced) if w]
    if words and words[-1] in _NOT_THE_SECRET:
        return False
    if len(words) > 1 and words[-1] in ("token", "key") and words[-2] in _NAMED_NOT_SECRET:
        return False  # a tokenizer's special tokens, a sort or cache key
    return any(w in SECRET_WORDS or w.endswith(_SECRET_ENDINGS) for w in words)


def reads_environment(text: Any) -> bool:
    return isinstance(text, str) and _ENV_NAME.search(text) is not None


def _leaves(node: Any, path: Path = ()) -> Iterator[tuple[Path, Any]]:
    if isinstance(node, dict):
        for key, value in node.items():
            yield from _leaves(value, (*path, key))
    elif isinstance(node, list):
        for index, value in enumerate(node):
            yield from _leaves(value, (*path, index))
    else:
        yield path, node


def _raw(cfg: Any) -> Any:
    """``cfg`` as plain data, interpolations unresolved (a DictConfig, a dataclass or a
    mapping); None when it is none of those."""
    from omegaconf import OmegaConf

    try:
        if not OmegaConf.is_config(cfg):
            cfg = OmegaConf.structured(cfg) if not isinstance(cfg, dict) else OmegaConf.create(cfg)
        raw = OmegaConf.to_container(cfg, resolve=False, enum_to_str=True)
    except Exception:  # not a config at all: its own check reports it
        return None
    if isinstance(raw, dict):
        raw.pop(_HYDRA, None)
        return raw
    return None


def _resolved_text(text: str) -> str | None:
    """An expression that reads the environment alone, resolved now (None otherwise)."""
    from omegaconf import OmegaConf

    try:
        value = OmegaConf.create({"v": text}).v
    except Exception:  # it reads other nodes, or the variable is unset
        return None
    return None if value is None else str(value)


def _looks_opaque(value: str) -> bool:
    """Whether a value read from a variable with a plain name could still be a secret
    (``DATABASE_URL``): long enough, not a number, not a file or folder that exists."""
    if len(value) < MIN_OPAQUE_LENGTH or os.path.exists(value):
        return False
    try:
        float(value)
    except ValueError:
        return True
    return False


def _secret_values(raw: dict[str, Any], expressions: dict[Path, str]) -> list[str]:
    """The values to scrub out of text: a secret-looking variable's (or one that a
    secret-looking key reads), any other variable's that could be one
    (:func:`_looks_opaque`), and a secret-looking key's literal text."""
    found: set[str] = set()
    for path, text in expressions.items():
        secret_key = bool(path) and is_secret_key(str(path[-1]))
        for name in _ENV_NAME.findall(text):
            value = os.environ.get(name) or ""
            if secret_key or is_secret_key(name) or _looks_opaque(value):
                found.add(value)
        if secret_key:
            found.add(_resolved_text(text) or "")
    for path, value in _leaves(raw):
        literal = isinstance(value, str) and not reads_environment(value)
        if path and literal and is_secret_key(str(path[-1])):
            found.add(value)
    return sorted((v for v in found if len(v) >= MIN_SECRET_LENGTH), key=len, reverse=True)


def remember(cfg: Any) -> None:
    """Note what the run's records must not show, from ``cfg`` as composed (its
    interpolations unresolved): the run of this process is that config's. A config that
    cannot be read as one leaves nothing noted (its own check reports it)."""
    raw = _raw(cfg)
    _expressions.clear()
    _values.clear()
    if raw is None:
        return
    _expressions.update({p: v for p, v in _leaves(raw) if reads_environment(v)})
    _values.extend(_secret_values(raw, _expressions))


def forget() -> None:
    _expressions.clear()
    _values.clear()


def scrub(text: str) -> str:
    """``text`` with every remembered secret value replaced by ``***``."""
    for value in _values:
        if value in text:
            text = text.replace(value, SHOWN)
    return text


def scrub_data(data: Any) -> Any:
    """Plain data with every secret value scrubbed out of its strings (keys included)."""
    if not _values:
        return data
    if isinstance(data, str):
        return scrub(data)
    if isinstance(data, dict):
        return {scrub_data(k): scrub_data(v) for k, v in data.items()}
    if isinstance(data, (list, tuple)):
        return type(data)(scrub_data(v) for v in data)
    return data


def _plain(cfg: Any) -> Any:
    from omegaconf import OmegaConf

    if OmegaConf.is_config(cfg):
        return OmegaConf.to_container(cfg, resolve=True, enum_to_str=True)
    return cfg


def _restore(node: Any, path: Path, show: Any) -> Any:
    """``node`` rebuilt, each leaf given by ``show(path, value)``."""
    if isinstance(node, dict):
        return {k: _restore(v, (*path, k), show) for k, v in node.items()}
    if isinstance(node, list):
        return [_restore(v, (*path, i), show) for i, v in enumerate(node)]
    return show(path, node)


def recorded_container(cfg: Any) -> Any:
    """The resolved ``cfg`` as plain data, each value read from the environment put back
    as its expression: what ``run_config.yaml`` holds and a resume compares."""
    return _restore(_plain(cfg), (), lambda path, value: _expressions.get(path, value))


def for_comparison(cfg: Any) -> Any:
    """:func:`recorded_container` as a DictConfig whose resolved values are the
    expressions themselves (escaped), for a comparison that resolves what it is given."""
    from omegaconf import OmegaConf

    def escaped(path: Path, value: Any) -> Any:
        text = _expressions.get(path)
        return value if text is None else text.replace("${", "\\${")

    return OmegaConf.create(_restore(_plain(cfg), (), escaped))


def _shown(path: Path, value: Any) -> Any:
    if path in _expressions:
        return _expressions[path]
    shown = isinstance(value, (str, int, float)) and not isinstance(value, bool) and value != ""
    if path and shown and is_secret_key(str(path[-1])):
        return SHOWN
    return scrub(value) if isinstance(value, str) and _values else value


def redacted(cfg: Any) -> Any:
    """``cfg`` (a DictConfig or plain data) as the log and the trackers may show it:
    values read from the environment as their expression, secret-looking keys as
    ``***``, secret values scrubbed out of every other text."""
    return _restore(_plain(cfg), (), _shown)


def redacted_count(cfg: Any) -> int:
    """How many values of ``cfg`` :func:`redacted` hides (an expression or ``***``)."""
    shown = dict(_leaves(redacted(cfg)))
    return sum(1 for path, value in _leaves(_plain(cfg)) if shown.get(path) != value)


def notice(cfg: Any) -> str | None:
    """The one line a run says about what its records hide (None: nothing hidden)."""
    count = redacted_count(cfg)
    if not count:
        return None
    return (
        f"values of {count} config key(s) read from the environment (${{oc.env:...}}) or "
        f"that look like secrets are shown as their expression or {SHOWN} in the run's "
        "records and log"
    )


def redacted_overrides(overrides: list[str]) -> list[str]:
    """Command-line overrides as a record shows them: a secret-looking key's value as
    ``***`` (an expression given by hand stays: it holds no value)."""
    shown = []
    for text in overrides:
        key, sep, value = text.partition("=")
        if sep and is_secret_key(key.lstrip("+~")) and not reads_environment(value):
            text = f"{key}={SHOWN}"
        shown.append(scrub(text) if _values else text)
    return shown


@contextlib.contextmanager
def scrubbing_logs() -> Iterator[None]:
    """Every log record made meanwhile, by any logger, has the secret values scrubbed
    out of its message before any handler (console, ``art_hydra.log``) formats it."""
    previous = logging.getLogRecordFactory()
    if getattr(previous, "_art_hydra_scrubs", False):
        yield  # an outer run scrubs already
        return

    def factory(*args: Any, **kwargs: Any) -> logging.LogRecord:
        record = previous(*args, **kwargs)
        if _values:
            try:
                message = record.getMessage()
            except Exception:  # a malformed record: its handler reports it as always
                return record
            record.msg, record.args = scrub(message), ()
        return record

    factory._art_hydra_scrubs = True  # type: ignore[attr-defined]
    logging.setLogRecordFactory(factory)
    try:
        yield
    finally:
        logging.setLogRecordFactory(previous)
