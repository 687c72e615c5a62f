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
import ctypes
import functools
import json
import os
import re
import threading
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from datetime import datetime
from pathlib import Path
from typing import Any

from art_hydra.model_files import CONFIG_MAX_BYTES, FolderError, read_json_file
from art_hydra.safe_paths import file_refusal, open_regular

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
#: The largest tokenizer.json loaded (real ones are a few to a few dozen megabytes).
TOKENIZER_MAX_BYTES = 256 << 20
#: Seconds one prompt's rendering may take: real chat templates take milliseconds.
RENDER_SECONDS = 2.0
#: Characters a rendered prompt, or any string or list a template builds, may reach.
RENDER_MAX_CHARS = 64 << 20
#: Memory one render may add to the process (Linux, as address space): a template that
#: doubles a string in a loop meets MemoryError instead of exhausting the machine.
RENDER_MAX_BYTES = 2 << 30


class TemplateOverrun(Exception):
    """The chat template did not finish one prompt within :data:`RENDER_SECONDS` or grew
    past :data:`RENDER_MAX_CHARS`: the template is the cause, not the data."""


class _Deadline(BaseException):
    """Raised inside the rendering thread when its time is up (a BaseException, so no
    ``except Exception`` on the way, jinja2's own included, swallows it)."""


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
    #: The file the chat template was read from (for messages).
    template_file: str = "tokenizer_config.json"

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
        chat = [{"role": role, "content": content} for role, content in messages]
        return self.render_chat(chat, None, True)

    def render_chat(
        self,
        messages: Sequence[dict[str, Any]],
        tools: list[dict[str, Any]] | None,
        add_generation_prompt: bool,
        template: str | None = None,
    ) -> str:
        """The chat template (``template``, else the folder's) applied to ``messages`` as
        dicts (tool calls and tool messages included) with the tools' schemas, as
        ``apply_chat_template(messages, tools=..., add_generation_prompt=...)`` renders
        them; within the same sandbox and bounds (:class:`TemplateOverrun`)."""
        template = template or self.chat_template
        assert template is not None
        return render_bounded(
            template,
            dict(
                messages=list(messages),
                tools=tools,
                documents=None,
                add_generation_prompt=add_generation_prompt,
                **self.specials,
            ),
            self.template_file,
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


def _overrun(where: str, what: str) -> str:
    return (
        f"the chat template in {where} {what} rendering one prompt (real "
        "templates take milliseconds): the template itself is the cause, not the data"
    )


def render_bounded(template: str, variables: dict[str, Any], where: str) -> str:
    """``template`` rendered with ``variables`` in the bounded sandbox: within
    :data:`RENDER_SECONDS`, :data:`RENDER_MAX_CHARS` and :data:`RENDER_MAX_BYTES`, else
    :class:`TemplateOverrun` naming ``where`` the template came from."""
    compiled = _compiled(template)

    def pieces() -> str:
        out: list[str] = []
        size = 0
        for piece in compiled.generate(**variables):
            size += len(piece)
            if size > RENDER_MAX_CHARS:
                raise TemplateOverrun(_overrun(where, f"grew past {RENDER_MAX_CHARS:,} characters"))
            out.append(piece)
        return "".join(out)

    try:
        with _memory_cap(RENDER_MAX_BYTES):
            return _within(RENDER_SECONDS, pieces)
    except MemoryError:
        raise TemplateOverrun(
            _overrun(where, f"needed more than {RENDER_MAX_BYTES >> 30} GiB of memory")
        ) from None
    except _Deadline:
        raise TemplateOverrun(
            _overrun(where, f"did not finish within {RENDER_SECONDS:g} seconds")
        ) from None
    except _TooLarge as exc:
        raise TemplateOverrun(_overrun(where, str(exc))) from None


@functools.lru_cache(maxsize=8)
def _compiled(template: str) -> Any:
    """The template compiled once (compiling took milliseconds per row)."""
    return _environment().from_string(template)


class _TooLarge(Exception):
    """A template built a string or list past :data:`RENDER_MAX_CHARS`."""


class _Watchdog:
    """One daemon thread that raises :class:`_Deadline` in a thread whose bounded work
    outlives its deadline (``PyThreadState_SetAsyncExc``: a template's Python loops stop
    wherever they are). One thread for every render, looking every :data:`POLL_S`
    seconds while renders come and sleeping once none has come for a while: starting a
    thread, or waking one, per prompt would cost more than most renders take."""

    POLL_S = 0.25
    IDLE_S = 10.0

    def __init__(self) -> None:
        self.lock = threading.Condition()
        self.watched: tuple[int, float, int] | None = None  # (thread, deadline, token)
        self.tokens = 0
        self.last = 0.0
        self.sleeping = True
        self.thread: threading.Thread | None = None

    def watch(self, seconds: float) -> int:
        with self.lock:
            if self.thread is None or not self.thread.is_alive():
                self.thread = threading.Thread(target=self._run, name="template-deadline")
                self.thread.daemon = True
                self.thread.start()
            self.tokens += 1
            self.last = time.monotonic()
            self.watched = (threading.get_ident(), self.last + seconds, self.tokens)
            if self.sleeping:
                self.sleeping = False
                self.lock.notify()
            return self.tokens

    def done(self, token: int) -> None:
        with self.lock:
            if self.watched is not None and self.watched[2] == token:
                self.watched = None

    def _run(self) -> None:
        with self.lock:
            while True:
                now = time.monotonic()
                if self.watched is None and now - self.last > self.IDLE_S:
                    self.sleeping = True
                    self.lock.wait()
                    continue
                if self.watched is not None and now >= self.watched[1]:
                    ident = self.watched[0]
                    self.watched = None  # raised once, and only while the work still runs
                    ctypes.pythonapi.PyThreadState_SetAsyncExc(
                        ctypes.c_ulong(ident), ctypes.py_object(_Deadline)
                    )
                self.lock.wait(self.POLL_S)


_WATCHDOG = _Watchdog()


def _within(seconds: float, work: Callable[[], str]) -> str:
    """``work()`` in this thread, interrupted by :class:`_Deadline` once ``seconds`` pass
    (:class:`_Watchdog`); the watch ends under its lock before ``work``'s result is
    returned, so the exception is never raised in the code after it."""
    token = _WATCHDOG.watch(seconds)
    try:
        try:
            return work()
        finally:
            _WATCHDOG.done(token)
    except _Deadline:
        raise


#: (when, bytes) of the last reading of the process's address space.
_SPACE: list[tuple[float, int]] = []


def _address_space() -> int:
    """The process's address space in bytes (``/proc/self/statm``), read again at most
    every quarter second: a render asks for every prompt. OSError where there is no
    procfs."""
    now = time.monotonic()
    if not _SPACE or now - _SPACE[0][0] > 0.25:
        with open("/proc/self/statm", encoding="ascii") as statm:
            pages = int(statm.read().split()[0])
        _SPACE[:] = [(now, pages * os.sysconf("SC_PAGE_SIZE"))]
    return _SPACE[0][1]


@contextlib.contextmanager
def _memory_cap(extra: int) -> Any:
    """Lower the process's address-space limit to what it uses now plus ``extra`` while
    the block runs (Linux; elsewhere, or where the limit is already lower, nothing)."""
    try:
        import resource

        soft, hard = resource.getrlimit(resource.RLIMIT_AS)
        cap = _address_space() + extra
        if hard != resource.RLIM_INFINITY:
            cap = min(cap, hard)
        lowered = soft == resource.RLIM_INFINITY or soft > cap
        if lowered:
            resource.setrlimit(resource.RLIMIT_AS, (cap, hard))
    except (ImportError, OSError, ValueError):
        lowered = False
    try:
        yield
    finally:
        if lowered:
            resource.setrlimit(resource.RLIMIT_AS, (soft, hard))


def _sized(value: Any) -> None:
    """Refuse a value a template built past :data:`RENDER_MAX_CHARS` (after a filter)."""
    if isinstance(value, (str, list, tuple)) and len(value) > RENDER_MAX_CHARS:
        raise _TooLarge(f"built a value of {len(value):,} items, more than {RENDER_MAX_CHARS:,}")


#: Functions and filters whose output can be far larger than their inputs.
_AMPLIFYING = frozenset(
    {"replace", "join", "format", "format_map", "indent", "center", "ljust", "rjust", "zfill",
     "expandtabs", "wordwrap"}
)  # fmt: skip


def _check_args(name: str, args: Sequence[Any], kwargs: dict[str, Any]) -> None:
    """Refuse a call whose numbers or strings would make C code build a huge value before
    any time check could run (``'x'.center(10**9)``, ``s|replace('a', big)``)."""
    values = [*args, *kwargs.values()]
    for value in values:
        if isinstance(value, int) and abs(value) > RENDER_MAX_CHARS:
            raise _TooLarge(f"called {name} with {value:,}, more than {RENDER_MAX_CHARS:,}")
    if name.rpartition(" ")[2] not in _AMPLIFYING:
        return
    sizes = [len(v) for v in values if isinstance(v, (str, list, tuple))]
    numbers = [abs(v) for v in values if isinstance(v, int) and not isinstance(v, bool)]
    inside = [
        sum(len(x) for x in v if isinstance(x, str)) for v in values if isinstance(v, (list, tuple))
    ]
    digits = [int(d) for v in values if isinstance(v, str) for d in re.findall(r"\d{7,}", v)]
    first = sizes[0] if sizes else 1
    grown = first * max([*sizes[1:], *numbers, 1]) + sum(inside) + max(digits, default=0)
    if grown > RENDER_MAX_CHARS:
        raise _TooLarge(f"called {name} on values that would make more than {RENDER_MAX_CHARS:,}")


def _binop(operator: str, left: Any, right: Any) -> None:
    """Bound ``*`` (repetition), ``**`` and ``%`` (a format's width) before Python runs them."""
    if operator == "*":
        sizes = [len(v) for v in (left, right) if isinstance(v, (str, list, tuple))]
        counts = [v for v in (left, right) if isinstance(v, int)]
        if sizes and counts and sizes[0] * counts[0] > RENDER_MAX_CHARS:
            raise _TooLarge(f"repeats a value to more than {RENDER_MAX_CHARS:,} items")
    elif operator == "**" and isinstance(left, int) and isinstance(right, int):
        if abs(left) > 1 and right * max(abs(left).bit_length(), 1) > 4096:
            raise _TooLarge(f"raises {left} to the power {right}")
    elif operator == "%" and isinstance(left, str):
        widths = re.findall(r"%[^a-zA-Z%]*?(\d{6,})", left)
        if any(int(w) > RENDER_MAX_CHARS for w in widths):
            raise _TooLarge(f"formats with a width past {RENDER_MAX_CHARS:,}")


def _bounded_sandbox() -> Any:
    """jinja2's immutable sandbox with the calls and operators whose C code could build a
    huge value checked first (a template's time is bounded by :func:`_within`)."""
    from jinja2.sandbox import ImmutableSandboxedEnvironment

    class Bounded(ImmutableSandboxedEnvironment):
        """Calls and operators whose C code could build a huge value are checked first."""

        intercepted_binops = frozenset({"*", "**", "%"})

        def call(__self, __context: Any, __obj: Any, *args: Any, **kwargs: Any) -> Any:
            name = getattr(__obj, "__name__", "a function")
            _check_args(name, args, kwargs)
            # A method's own object: str.format comes wrapped by the sandbox.
            owner = getattr(__obj, "__self__", None)
            owner = getattr(getattr(__obj, "__wrapped__", None), "__self__", owner)
            if owner is not None:
                _check_args(name, (owner, *args), {})
            found = super().call(__context, __obj, *args, **kwargs)
            _sized(found)
            return found

        def getattr(self, obj: Any, attribute: str) -> Any:
            found = super().getattr(obj, attribute)
            _sized(found)  # a namespace's string doubled by ``~`` in a loop
            return found

        def getitem(self, obj: Any, argument: Any) -> Any:
            found = super().getitem(obj, argument)
            _sized(found)
            return found

        def call_binop(self, context: Any, operator: str, left: Any, right: Any) -> Any:
            _binop(operator, left, right)
            found = super().call_binop(context, operator, left, right)
            _sized(found)
            return found

    return Bounded


_ENV: list[Any] = []


def _environment() -> Any:
    """jinja2's immutable sandbox set up as transformers sets it up for chat templates."""
    if _ENV:
        return _ENV[0]
    import jinja2
    import jinja2.ext

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

    env = _bounded_sandbox()(
        trim_blocks=True, lstrip_blocks=True, extensions=[Generation, jinja2.ext.loopcontrols]
    )
    env.filters = {name: _bounded_filter(name, f) for name, f in env.filters.items()}
    env.filters["tojson"] = tojson
    env.globals["raise_exception"] = raise_exception
    env.globals["strftime_now"] = lambda fmt: datetime.now().strftime(fmt)
    env.globals["dict"] = dict
    _ENV.append(env)
    return env


def _bounded_filter(name: str, filter_fn: Any) -> Any:
    """``filter_fn`` with its arguments checked first and its result after (a filter's
    ``pass_context``/``pass_environment`` marks are kept)."""

    @functools.wraps(filter_fn)
    def bounded(*args: Any, **kwargs: Any) -> Any:
        plain = [a for a in args if not hasattr(a, "environment") and not hasattr(a, "filters")]
        _check_args(f"the filter {name}", plain, kwargs)
        found = filter_fn(*args, **kwargs)
        _sized(found)
        return found

    return bounded


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
    size = os.stat(folder / "tokenizer.json").st_size
    if size > TOKENIZER_MAX_BYTES:
        raise FolderError(
            f"tokenizer.json is {size:,} bytes, more than the {TOKENIZER_MAX_BYTES:,} the "
            "pre-flight loads (real ones are a few dozen megabytes at most)"
        )
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
    template, where = template_source(folder, config)
    return FolderTokenizer(core, config, specials, template, added, str(folder / where))


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
    return template_source(folder, config)[0]


def template_source(folder: Path, config: dict[str, Any]) -> tuple[str | None, str]:
    """(the default chat template, the name of the file it is read from); a template
    file is read within :data:`~art_hydra.model_files.CONFIG_MAX_BYTES`."""
    path = folder / TEMPLATE_FILES[0]
    if path.is_file():
        try:
            with open_regular(path) as handle:
                raw = handle.read(CONFIG_MAX_BYTES + 1)
            if len(raw) > CONFIG_MAX_BYTES:
                raise ValueError(f"more than {CONFIG_MAX_BYTES:,} bytes")
            return raw.decode("utf-8"), path.name
        except (OSError, ValueError) as exc:
            why = exc.strerror if isinstance(exc, OSError) and exc.strerror else exc
            raise FolderError(f"{path.name} cannot be read ({why})") from exc
    value: Any = config.get("chat_template")
    where = "tokenizer_config.json"
    if (folder / TEMPLATE_FILES[1]).is_file():
        loaded = read_json_file(folder / TEMPLATE_FILES[1])
        value = loaded.get("chat_template") if isinstance(loaded, dict) else None
        where = TEMPLATE_FILES[1]
    if isinstance(value, list):
        named = {t.get("name"): t.get("template") for t in value if isinstance(t, dict)}
        value = named.get("default")
    return (value if isinstance(value, str) and value else None), where


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
