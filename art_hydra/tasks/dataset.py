"""``task.source=dataset``: a user's data in TRL's formats, streamed row by row.

Where the data comes from (``task.path``):

- a file: ``.jsonl`` (and ``.json`` holding JSON lines) read line by line as ``task=jsonl``
  reads it (each row named ``file:line``); ``.json`` holding one array; ``.csv``/``.tsv``
  (``file:line``); ``.parquet`` and ``.arrow`` in record batches (``file:row N``, N counted
  from 0 as ``datasets`` and pandas index);
- a folder of such files, split by file name as ``datasets`` splits a hub repository
  (``train-00000.parquet``, ``data/test.jsonl`` ...; a folder without split names is all
  ``train``);
- a ``save_to_disk`` folder, read with ``datasets.load_from_disk`` (memory-mapped Arrow,
  iterated in batches; rows named ``split:row``);
- a hub dataset id (``owner/name``) whose files are already in the local hub cache
  (``hf download owner/name --repo-type dataset``): nothing is downloaded, at the
  pre-flight or at run time; a missing one is one error naming that command.

Nothing holds a whole file: rows are converted one at a time, so the pre-flight's pass
over a large dataset keeps only its statistics. Every read is bounded before it decodes
(a folder's files are data from elsewhere): a dataset card through the bounded YAML
reader, a parquet file by its footer (row groups' decompressed sizes and value counts),
an Arrow file by its messages (compressed record batches and types that can hide data,
dictionary, run-end encoded or view columns, are refused), and every row, whatever the
format, by the same size as a JSONL line (:func:`art_hydra.tasks.jsonl.line_limit`),
measured in Arrow before any Python value is made. A card's ``data_files`` that name a
remote location (``hf://``, ``https://``, ``s3://``, any URL or fsspec chain) are refused
unless ``task.allow_remote_data=true`` was given on the command line; even then only the
run fetches them (:func:`fetch_remote`), never the pre-flight. The ``datasets`` library
(and pyarrow) are imported inside the functions that read, and neither imports torch.

Each row becomes an :class:`Example` by TRL's formats (see :func:`row_example`).
"""

from __future__ import annotations

import csv
import os
import re
import struct
from collections.abc import Iterator, Mapping
from dataclasses import dataclass, field
from typing import Any
from urllib.parse import urlparse

from art_hydra import model_files, safe_json
from art_hydra.config.yaml_guard import YamlRefused, read_text_bounded, text_refusal
from art_hydra.safe_paths import open_regular
from art_hydra.tasks.examples import Example, message_problem, not_text
from art_hydra.tasks.jsonl import iter_records

#: Columns that usually hold the prompt or the answer, offered as the mapping's value when
#: the expected column is missing.
PROMPT_GUESSES = ("question", "instruction", "query", "problem", "input", "text")
ANSWER_GUESSES = ("solution", "answer", "output", "response", "target", "ground_truth", "label")
#: Suffixes read, by format.
FORMATS = {
    ".jsonl": "jsonl",
    ".json": "json",
    ".csv": "csv",
    ".tsv": "tsv",
    ".parquet": "parquet",
    ".arrow": "arrow",
}
#: Rows converted per Arrow batch: memory stays bounded by a few rows.
BATCH_ROWS = 64
#: A ``.json`` file holding one array is parsed whole; larger ones must be JSON lines.
MAX_JSON_ARRAY_BYTES = 64 << 20
#: A dataset card (README.md) is read no further than this.
MAX_CARD_BYTES = 1 << 20
#: A parquet footer (its metadata) larger than this is refused unread.
MAX_PARQUET_FOOTER_BYTES = 16 << 20
#: The bytes one parquet row group may take once decompressed: pyarrow decodes a row
#: group's pages whole, so this bounds the memory one file can take, whatever it weighs.
MAX_ROW_GROUP_BYTES = 256 << 20
#: Values one row group's column may hold (nulls and list items counted).
MAX_ROW_GROUP_VALUES = 16 << 20
#: Rows one parquet or Arrow file may hold, and columns it may have.
MAX_FILE_ROWS = 100_000_000
MAX_COLUMNS = 10_000
#: The decoded bytes one batch of rows may take (a batch is fewer rows when its row
#: groups are large).
MAX_BATCH_BYTES = 256 << 20


@dataclass(frozen=True)
class Columns:
    """``task.columns`` as plain values: the column of each role."""

    prompt: str = "prompt"
    #: None: ``completion`` (TRL's prompt-completion), else ``answer``, when present.
    answer: str | None = None
    messages: str = "messages"

    @classmethod
    def of(cls, task_cfg: Any) -> Columns:
        cols = task_cfg.get("columns") if hasattr(task_cfg, "get") else None
        if cols is None:
            return cls()
        return cls(
            str(cols.prompt), None if cols.answer is None else str(cols.answer), str(cols.messages)
        )


@dataclass(frozen=True)
class BadRow:
    """Why a row cannot be an example, and the overrides that would fix it, if any."""

    message: str
    fix: dict[str, str] | None = None


class SourceError(Exception):
    """``task.path`` names nothing readable as a dataset: the message says why, the fix
    (free text) what to do."""

    def __init__(self, message: str, fix: str) -> None:
        super().__init__(message)
        self.fix = fix


# ---- rows -> examples ----------------------------------------------------------------


def _messages(value: list[Any], column: str) -> tuple[tuple[str, str], ...] | str:
    """TRL's conversational value (a list of {role, content}) as pairs, or why not. An
    assistant turn that calls tools may have no content (its pair holds ``""``); its
    ``tool_calls`` are checked here and kept by :func:`_conversation`."""
    if not value:
        return f"'{column}' is an empty list of messages"
    pairs = []
    for i, message in enumerate(value):
        found = message_problem(_present(message), f"'{column}'[{i}]")
        if found is not None:
            return found
        pairs.append((message["role"], message.get("content") or ""))
    return tuple(pairs)


def _present(message: Any) -> Any:
    """A message without the keys whose value is null (a parquet or Arrow column of
    message structs gives every message every key: a user turn's ``tool_calls: null``)."""
    if not isinstance(message, Mapping):
        return message
    return {k: v for k, v in message.items() if v is not None or k == "content"}


def _is_tool_conversation(value: list[Any]) -> bool:
    """Whether a ``messages`` row is more than a prompt and one answer: an assistant turn
    with tool calls, a tool result, or several assistant turns. SFT then trains on every
    assistant turn of it (:attr:`Example.conversation`)."""
    present = [_present(m) for m in value]
    assistants = [m for m in present if m.get("role") == "assistant"]
    return (
        len(assistants) > 1
        or any(m.get("tool_calls") for m in assistants)
        or any(m.get("role") == "tool" for m in present)
    )


def _row_tools(record: Mapping[str, Any]) -> BadRow | None:
    """Why a row's ``tools`` column (TRL's per-row JSON schemas of the tools the
    conversation may call) is not a list of ``{type: function, function: {name, ...}}``,
    or its JSON text (None: it is, or there is none)."""
    tools = record.get("tools")
    if tools is None:
        return None
    if isinstance(tools, str):
        try:
            tools = safe_json.loads(tools)
        except ValueError:
            return BadRow("'tools' is text that is not JSON; it holds the tools' JSON schemas")
    if not isinstance(tools, list) or not all(
        isinstance(t, Mapping)
        and isinstance(t.get("function"), Mapping)
        and isinstance(t["function"].get("name"), str)
        for t in tools
    ):
        return BadRow(
            "'tools' must be a list of JSON schemas {type: 'function', function: {name, "
            "description, parameters}} (TRL's tools column)"
        )
    return None


def _text(pairs: tuple[tuple[str, str], ...]) -> str:
    """The messages' text, for logs and the tiny model's character set."""
    return "\n".join(content for _, content in pairs)


def _guess(present: list[str], guesses: tuple[str, ...]) -> str:
    return next((c for c in guesses if c in present), "<column>")


def _answer(
    record: Mapping[str, Any], columns: Columns, needed_by: str | None
) -> str | BadRow | None:
    """The row's reference answer: the mapped column, else ``completion``, else ``answer``."""
    name = columns.answer or next((c for c in ("completion", "answer") if c in record), None)
    present = list(record)
    if columns.answer is not None and columns.answer not in record:
        return BadRow(
            f"has no '{columns.answer}' column (task.columns.answer); its columns are "
            f"{', '.join(present)}",
            {"task.columns.answer": _guess(present, ANSWER_GUESSES)},
        )
    value = None if name is None else record[name]
    if isinstance(value, list):  # TRL's conversational completion: assistant messages
        pairs = _messages(value, name or "")
        if isinstance(pairs, str):
            return BadRow(pairs)
        if any(role != "assistant" for role, _ in pairs):
            return BadRow(f"'{name}' as messages must hold only assistant turns")
        value = "".join(content for _, content in pairs)
    if value is not None and not isinstance(value, str):
        return BadRow(f"'{name}' must be text, not {type(value).__name__}")
    if value is not None:
        reason = not_text(value, optional=False)
        if reason is not None:
            return BadRow(f"'{name}' {reason}")
    if needed_by and not value:
        if name is not None:
            return BadRow(f"has an empty '{name}', which {needed_by} needs")
        return BadRow(
            f"has no answer column (its columns: {', '.join(present)}), which {needed_by} needs",
            {"task.columns.answer": _guess(present, ANSWER_GUESSES)},
        )
    return value


def _prompt(value: Any, column: str) -> tuple[str, tuple[tuple[str, str], ...]] | BadRow:
    """(prompt text, messages) of a prompt column's value: text or a list of messages."""
    if isinstance(value, str):
        reason = not_text(value, optional=False)
        if reason is not None:
            return BadRow(f"'{column}' {reason}")
        if not value.strip():
            return BadRow(f"'{column}' is empty")
        return value, ()
    if isinstance(value, list):
        pairs = _messages(value, column)
        if isinstance(pairs, str):
            return BadRow(pairs)
        if not _text(pairs).strip():
            return BadRow(f"'{column}' has only empty messages")
        return _text(pairs), pairs
    kind = "null" if value is None else type(value).__name__
    return BadRow(f"'{column}' must be text or a list of messages, not {kind}")


def _conversation(
    value: Any, column: str, needed_by: str | None
) -> tuple[str, tuple[tuple[str, str], ...], str | None] | BadRow:
    """TRL's conversational language-modeling row (``messages``): the last assistant turn
    is the answer, every turn before it the prompt (earlier assistant turns are context,
    not trained on)."""
    if not isinstance(value, list):
        return BadRow(f"'{column}' must be a list of messages, not {type(value).__name__}")
    pairs = _messages(value, column)
    if isinstance(pairs, str):
        return BadRow(pairs)
    answer = None
    if pairs[-1][0] == "assistant":
        pairs, answer = pairs[:-1], pairs[-1][1]
    elif needed_by:
        return BadRow(
            f"'{column}' ends with a {pairs[-1][0]!r} turn; {needed_by} trains on the last "
            "assistant turn, so the conversation must end with one"
        )
    if not pairs or not _text(pairs).strip():
        return BadRow(f"'{column}' has no prompt before its last assistant turn")
    return _text(pairs), pairs, answer


def _conversation_example(
    record: Mapping[str, Any], columns: Columns, needed_by: str | None
) -> tuple[str, tuple[tuple[str, str], ...], str | None, tuple[Any, ...] | None] | BadRow:
    """A ``messages`` row: :func:`_conversation`'s prompt and answer, and the whole
    conversation where it has tool calls, tool results or several assistant turns."""
    found = _conversation(record[columns.messages], columns.messages, needed_by)
    if isinstance(found, BadRow):
        return found
    value = record[columns.messages]
    if not _is_tool_conversation(value):
        return (*found, None)
    bad = _row_tools(record)
    if bad is not None:
        return bad
    return (*found, tuple(_present(m) for m in value))


def _no_prompt_column(record: Mapping[str, Any], columns: Columns, needed_by: str | None) -> BadRow:
    """A row with neither the prompt nor the conversation column: one report, with the
    columns to map."""
    present = list(record)
    # The answer column is judged too, so a row missing both is one report, not two
    # in turn (the answer's only after the prompt's is fixed).
    answer = _answer(record, columns, needed_by)
    mapping = {"task.columns.prompt": _guess(present, PROMPT_GUESSES)}
    also = ""
    if isinstance(answer, BadRow) and answer.fix:
        mapping.update(answer.fix)
        also = (
            f", nor a '{columns.answer}' column (task.columns.answer)"
            if columns.answer is not None
            else f", nor an answer column ('completion' or 'answer'), which {needed_by} needs"
        )
    return BadRow(
        f"has neither a '{columns.prompt}' column (task.columns.prompt) nor a "
        f"'{columns.messages}' column (task.columns.messages){also}; its columns are "
        f"{', '.join(present) or 'none'}",
        mapping,
    )


def row_example(
    record: Mapping[str, Any], columns: Columns, needed_by: str | None
) -> Example | BadRow:
    """One row in TRL's formats as an :class:`Example`, or why it cannot be one.

    - ``prompt`` (``task.columns.prompt``): text (standard) or a list of
      ``{role, content}`` messages (conversational), with an optional answer column
      (``completion``, text or assistant messages; see :func:`_answer`);
    - else ``messages`` (``task.columns.messages``): a whole conversation, its last
      assistant turn the answer; one with tool calls, tool results or several assistant
      turns is also kept whole as :attr:`Example.conversation` (SFT then trains every
      assistant turn), with the row's ``tools`` column (TRL's JSON schemas) checked and
      kept in :attr:`Example.columns`.

    Every column but the prompt, the messages and TRL's ``completion`` is kept in
    :attr:`Example.columns`, under its own name, for the rewards (a mapped answer column
    such as ``solution`` stays there too, as TRL passes it); with ``task.columns.answer``
    set, the ``answer`` column the rewards see is the mapped one (a data column named
    ``answer`` is shadowed), so every reward, batched or not, gets the same answer."""
    conversation = None
    if columns.prompt in record:
        prompt = _prompt(record[columns.prompt], columns.prompt)
        if isinstance(prompt, BadRow):
            return prompt
        answer = _answer(record, columns, needed_by)
        if isinstance(answer, BadRow):
            return answer
        text, pairs = prompt
    elif columns.messages in record:
        found = _conversation_example(record, columns, needed_by)
        if isinstance(found, BadRow):
            return found
        text, pairs, answer, conversation = found
    else:
        return _no_prompt_column(record, columns, needed_by)
    used = {columns.prompt, columns.messages, "completion"}
    kept = {k: v for k, v in record.items() if k not in used}
    if columns.answer is not None and columns.prompt in record:
        # The mapping is the one place the answer is chosen: a batched reward's ``answer``
        # column is the mapped one, as the per-sample reward's, SFT's and evaluation's are.
        kept["answer"] = answer
    return Example(
        prompt=text,
        answer=answer,
        messages=pairs,
        plain=not pairs,
        columns=kept,
        conversation=conversation,
    )


def unused_mappings(
    record: Mapping[str, Any], columns: Columns
) -> dict[str, tuple[Any, str, dict[str, Any]]]:
    """The ``task.columns`` the user mapped that this row's format does not read, by key:
    ``(value, why)``. A prompt row never reads the conversation column; a conversation
    row (``messages``) never reads the prompt or answer column (its answer is its last
    assistant turn). They run, but what the user set does nothing: a warning."""
    found: dict[str, tuple[Any, str, dict[str, Any]]] = {}
    default = Columns()
    if columns.prompt in record:
        if columns.messages != default.messages:
            found["task.columns.messages"] = (
                columns.messages,
                f"is not used: the rows have the prompt column '{columns.prompt}', and a "
                "conversation column is read only from rows without one",
                {"task.columns.messages": default.messages},
            )
    elif columns.messages in record:
        if columns.prompt != default.prompt:
            found["task.columns.prompt"] = (
                columns.prompt,
                f"is not used: the rows are whole conversations ('{columns.messages}') and "
                f"have no '{columns.prompt}' column; their columns are {', '.join(record)}",
                {"task.columns.prompt": default.prompt},
            )
        if columns.answer is not None:
            found["task.columns.answer"] = (
                columns.answer,
                f"is not used: the rows are whole conversations ('{columns.messages}'), whose "
                "answer is the last assistant turn",
                {"task.columns.answer": None},
            )
    return found


# ---- where the rows come from ------------------------------------------------------------


@dataclass(frozen=True)
class Source:
    """What ``task.path`` names: data files by split, or a ``save_to_disk`` folder."""

    #: The path or hub id as given.
    name: str
    #: Data files of each split (files and plain folders; a cached hub dataset's snapshot).
    files: Mapping[str, tuple[str, ...]] | None = None
    #: A ``save_to_disk`` folder.
    saved: str | None = None
    #: The folder the files' names are shown relative to (None: shown whole).
    base: str | None = None
    #: Patterns of each split that name remote files (a card's ``data_files``, allowed by
    #: ``task.allow_remote_data``): fetched by the run only (:func:`fetch_remote`).
    remote: Mapping[str, tuple[str, ...]] = field(default_factory=dict)
    #: Fetched files by their local path: the name each had where it came from (a cached
    #: download has no suffix; its format and its name in messages are the remote one's).
    fetched: Mapping[str, str] = field(default_factory=dict)


def is_remote(pattern: str) -> bool:
    """Whether a data file pattern names anything but a local path: a URL of any scheme
    (``hf://``, ``https://``, ``s3://``, ``data:``) or an fsspec chain (``zip://x::...``),
    as ``datasets`` would open it through fsspec."""
    return bool(urlparse(pattern).scheme) or "::" in pattern


def resolve_source(path: str, allow_remote: bool = False) -> Source:
    """``task.path`` as a :class:`Source`; :class:`SourceError` when nothing is there, or
    when it names remote data and ``allow_remote`` (``task.allow_remote_data`` set on
    the command line) is not given. Nothing here contacts a host."""
    if is_remote(path) and not os.path.lexists(os.path.expanduser(path)):
        raise SourceError(
            "is a remote location; art_hydra reads local data, and the pre-flight never "
            "contacts a host",
            "download it first (hf download <owner/name> --repo-type dataset, or any copy "
            "to a local file), then task.path=<the local file or folder>",
        )
    local = os.path.expanduser(path)
    if os.path.isfile(local):
        if _format(local) is None:
            raise SourceError(
                f"is a file of a format task=dataset does not read (it reads {', '.join(FORMATS)})",
                "convert it to JSONL or parquet, or task.path=<folder of such files>",
            )
        return Source(path, files={"train": (local,)})
    if os.path.isdir(local):
        if any(os.path.isfile(os.path.join(local, f)) for f in ("state.json", "dataset_dict.json")):
            return Source(path, saved=local)
        return _folder_source(path, local, allow_remote)
    hub_like = model_files.HUB_ID.match(path) and _format(path) is None and not path.startswith(".")
    if os.path.lexists(local) or not hub_like:
        what = (
            "not a regular file or folder" if os.path.lexists(local) else "no such file or folder"
        )
        raise SourceError(
            f"is {what} (nor a hub dataset id, owner/name)",
            "task.path=<a data file, a folder of them or a cached hub dataset id>",
        )
    snapshot = _cached_snapshot(path)
    return _folder_source(path, snapshot, allow_remote)


def _folder_source(path: str, folder: str, allow_remote: bool) -> Source:
    """A folder's source; a card's remote ``data_files`` are kept unresolved (allowed) or
    refused, and in both cases nothing is fetched here."""
    configs = _card_configs(folder)
    declared = _card_patterns(configs[0]) if len(configs) == 1 else None
    remote = sorted({p for ps in (declared or {}).values() for p in ps if is_remote(p)})
    if not remote:
        return Source(path, files=_folder_files(folder, configs), base=folder)
    shown = ", ".join(remote[:3]) + (f" and {len(remote) - 3} more" if len(remote) > 3 else "")
    if not allow_remote:
        raise SourceError(
            f"has a dataset card (README.md) whose data_files name remote files ({shown}); "
            "the pre-flight never contacts a host, and a folder's card cannot make the run "
            "fetch anything",
            "task.allow_remote_data=true on the command line (the run fetches them when it "
            f"starts; nothing else does), or download them into {folder}",
        )
    assert declared is not None
    return Source(path, base=folder, remote={split: tuple(ps) for split, ps in declared.items()})


def _format(path: str) -> str | None:
    return FORMATS.get(os.path.splitext(path)[1].lower())


def _card_configs(folder: str) -> list[dict[str, Any]]:
    """The ``configs:`` a dataset card (README.md's YAML header) declares: how the hub and
    ``load_dataset`` group a repository's files into configs and splits. The card is read
    through the bounded YAML reader (size, nesting, alias expansion): a card that passes
    a bound is refused, naming it, before ``yaml.safe_load`` sees it."""
    import yaml

    card_path = os.path.join(folder, "README.md")
    if not os.path.lexists(card_path):
        return []
    try:
        text = read_text_bounded(card_path, MAX_CARD_BYTES)
    except YamlRefused as exc:
        raise SourceError(
            f"has a dataset card that cannot be read within bounds: {exc}",
            f"repair or remove {card_path}",
        ) from None
    if not text.startswith("---"):
        return []
    header, _, _ = text[3:].partition("\n---")
    why = text_refusal(header)
    if why is not None:
        raise SourceError(
            f"has a dataset card whose YAML header {why} ({card_path})",
            f"repair or remove {card_path}",
        )
    try:
        card = yaml.safe_load(header)
    except (yaml.YAMLError, RecursionError):
        return []
    configs = card.get("configs") if isinstance(card, dict) else None
    return [c for c in configs if isinstance(c, dict)] if isinstance(configs, list) else []


def _card_patterns(config: dict[str, Any]) -> dict[str, list[str]] | None:
    """One card config's ``data_files`` as split -> patterns (None: not declared)."""
    files = config.get("data_files")
    if isinstance(files, (str, list)) and all(
        isinstance(f, str) for f in ([files] if isinstance(files, str) else files)
    ):
        return {"train": [files] if isinstance(files, str) else list(files)}
    if not isinstance(files, list):
        return None
    patterns: dict[str, list[str]] = {}
    for entry in files:
        if isinstance(entry, dict) and isinstance(entry.get("split"), str):
            path = entry.get("path")
            paths = [path] if isinstance(path, str) else path
            if isinstance(paths, list):
                patterns.setdefault(entry["split"], []).extend(str(p) for p in paths)
    return patterns or None


def _folder_files(
    folder: str, configs: list[dict[str, Any]] | None = None
) -> dict[str, tuple[str, ...]]:
    """A folder's data files by split, as ``datasets`` splits a repository: by its card's
    one declared config, else by file name. A repository of several configs (gsm8k's
    ``main`` and ``socratic``) is refused rather than merged: each config is another
    dataset (other answers, other formats), and training on all of them at once is never
    what was meant."""
    from datasets.data_files import DataFilesDict, EmptyDatasetError, get_data_patterns
    from datasets.exceptions import DataFilesNotFoundError

    configs = _card_configs(folder) if configs is None else configs
    if len(configs) > 1:
        names = [str(c.get("config_name", i)) for i, c in enumerate(configs)]
        raise SourceError(
            f"holds {len(configs)} configs ({', '.join(names)}), each a dataset of its own; "
            "art_hydra reads one and never merges them",
            f"task.path=<the folder or files of one config, under {folder}>",
        )
    try:
        declared = _card_patterns(configs[0]) if configs else None
        patterns = declared or get_data_patterns(folder)
        found = DataFilesDict.from_patterns(patterns, base_path=folder)
    except (EmptyDatasetError, DataFilesNotFoundError, FileNotFoundError):
        found = {}
    files = {
        str(split): tuple(f for f in sorted(names) if _format(f) is not None)
        for split, names in found.items()
    }
    files = {split: names for split, names in files.items() if names}
    # One split's files from several folders side by side (main/train-*, socratic/train-*)
    # are several configs' (split folders, train/ and test/, each hold one split's).
    tops: set[str] = set()
    for names in files.values():
        here = {
            os.path.relpath(f, folder).split(os.sep)[0]
            for f in names
            if os.sep in os.path.relpath(f, folder)
        } - {"data"}
        tops = here if len(here) > len(tops) else tops
    if not configs and len(tops) > 1:  # no card to tell which config is meant
        raise SourceError(
            f"holds data in {len(tops)} folders ({', '.join(sorted(tops))}), as a repository "
            "of several configs does; art_hydra reads one and never merges them",
            f"task.path=<one of those folders, under {folder}>",
        )
    if not files:
        raise SourceError(
            f"is a folder with no data files ({', '.join(FORMATS)}) and no save_to_disk dataset",
            "task.path=<a data file, or a folder holding them>",
        )
    return files


def _cached_snapshot(repo_id: str) -> str:
    """The folder of hub dataset ``repo_id`` in the local hub cache; never downloads."""
    from huggingface_hub import constants, snapshot_download
    from huggingface_hub.errors import LocalEntryNotFoundError

    try:
        return snapshot_download(repo_id, repo_type="dataset", local_files_only=True)
    except (LocalEntryNotFoundError, OSError, ValueError) as exc:
        raise SourceError(
            f"is not a local file or folder, and no hub dataset {repo_id!r} is in the local "
            f"cache ({constants.HF_HUB_CACHE}); art_hydra never downloads data at run time "
            f"({type(exc).__name__})",
            f"hf download {repo_id} --repo-type dataset (then run again), or "
            "task.path=<local file>",
        ) from exc


def fetch_remote(source: Source) -> Source:
    """``source`` with its remote patterns fetched into the local ``datasets`` cache (the
    run's start, with ``task.allow_remote_data=true`` given on the command line; the
    pre-flight never calls this). The fetched files are then read like local ones, with
    the same bounds."""
    if not source.remote:
        return source
    from datasets.data_files import DataFilesDict
    from datasets.utils.file_utils import cached_path

    fetched: dict[str, str] = {}
    files: dict[str, tuple[str, ...]] = {}
    try:
        found = DataFilesDict.from_patterns(
            {k: list(v) for k, v in source.remote.items()}, base_path=source.base or ""
        )
        for split, names in found.items():
            local = []
            for name in sorted(str(n) for n in names if _format(str(n)) is not None):
                path = cached_path(name) if is_remote(name) else name
                fetched[path] = name
                local.append(path)
            files[str(split)] = tuple(local)
    except Exception as exc:  # the network, the host or the files: named, never a traceback
        raise SourceError(
            f"names remote files that could not be fetched ({type(exc).__name__}: {exc})",
            "check the data_files of its card and the network, or download them locally",
        ) from exc
    return Source(source.name, files=files, base=None, fetched=fetched)


def split_names(source: Source) -> list[str]:
    """The splits ``source`` has."""
    if source.remote:
        return list(source.remote)
    if source.files is not None:
        return list(source.files)
    return list(_load_saved(source.saved or "").keys())


def _load_saved(folder: str) -> Mapping[str, Any]:
    from datasets import Dataset, load_from_disk

    loaded = load_from_disk(folder)
    return {"train": loaded} if isinstance(loaded, Dataset) else loaded


@dataclass(frozen=True)
class RowLimit:
    """The most bytes one row may take, and the budget it comes from (for messages)."""

    bytes: int
    reason: str

    def refusal(self, size: int) -> str:
        return (
            f"the row has {size:,} bytes, far more than a prompt that fits {self.reason} could "
            f"take (at most {self.bytes:,} bytes per row); shorten or drop it"
        )


Rows = Iterator[tuple[str, Mapping[str, Any] | str]]


def iter_rows(source: Source, split: str, max_line_bytes: int, limit_reason: str) -> Rows:
    """Every row of ``split`` as ``(where, record or why it cannot be read)``, streamed.
    A source with remote files not yet fetched (:func:`fetch_remote`) gives one row
    saying so: nothing here contacts a host."""
    limit = RowLimit(max_line_bytes, limit_reason)
    if source.remote:
        yield (
            source.name,
            (
                "names remote data files, fetched only when the run starts "
                "(task.allow_remote_data=true): nothing is read from them before"
            ),
        )
        return
    if source.saved is not None:
        yield from _saved_rows(source.saved, split, limit)
        return
    for path in (source.files or {}).get(split, ()):
        shown = os.path.relpath(path, source.base) if source.base else path
        yield from _file_rows(path, source.fetched.get(path, shown), limit)


def _saved_rows(folder: str, split: str, limit: RowLimit) -> Rows:
    refused = _saved_refusal(folder)
    if refused is not None:
        yield folder, refused
        return
    try:
        dataset = _load_saved(folder)[split]
        tables = dataset.with_format("arrow").iter(batch_size=BATCH_ROWS)
        schema_refusal = _type_refusal(dataset.data.schema)
    except Exception as exc:  # a damaged save: its state files or Arrow shards
        yield folder, f"cannot be read with datasets.load_from_disk: {type(exc).__name__}: {exc}"
        return
    if schema_refusal is not None:
        yield folder, schema_refusal
        return
    index = 0
    for table in tables:
        for batch in table.to_batches():
            for _, record in _checked_rows(batch, f"{split}:", index, limit):
                yield f"{split}:{index}", record
                index += 1


def _saved_refusal(folder: str) -> str | None:
    """Why a ``save_to_disk`` folder cannot be loaded within bounds (None: it can): its
    JSON state files are read with the bounded reader (``datasets`` would parse them
    unbounded), the Arrow files they list must lie in the folder, each checked as
    :func:`_arrow_refusal` checks one."""
    parts = [folder]
    try:
        if os.path.isfile(os.path.join(folder, "dataset_dict.json")):
            splits = safe_json.read(os.path.join(folder, "dataset_dict.json")).get("splits", [])
            parts = [os.path.join(folder, str(name)) for name in splits if _plain_name(name)]
        for part in parts:
            state = safe_json.read(os.path.join(part, "state.json"))
            for entry in state.get("_data_files", []):
                name = entry.get("filename") if isinstance(entry, dict) else None
                if not _plain_name(name):
                    return f"{part}/state.json lists a data file {name!r} outside its folder"
                refused = _arrow_refusal(os.path.join(part, str(name)))
                if refused is not None:
                    return f"{name} {refused}"
            if os.path.isfile(os.path.join(part, "dataset_info.json")):
                safe_json.read(os.path.join(part, "dataset_info.json"))
    except (ValueError, AttributeError, TypeError) as exc:
        return f"is not a save_to_disk folder that can be read within bounds: {exc}"
    return None


def _plain_name(name: Any) -> bool:
    return isinstance(name, str) and bool(name) and "/" not in name and name not in (".", "..")


def _file_rows(path: str, shown: str, limit: RowLimit) -> Rows:
    """``path``'s rows, by the format its suffix (or, fetched, its remote name) says."""
    kind = _format(path) or _format(shown)
    if kind == "json" and not _is_json_array(path):
        kind = "jsonl"
    if kind == "jsonl":
        for where, record in iter_records(
            path, max_line_bytes=limit.bytes, limit_reason=limit.reason
        ):
            yield shown + where[len(path) :], record
        return
    reader = {
        "json": _json_array_rows,
        "csv": _csv_rows,
        "tsv": _csv_rows,
        "parquet": _parquet_rows,
    }.get(kind or "", _arrow_rows)
    try:
        yield from reader(path, shown, limit)
    except (OSError, ValueError, csv.Error, struct.error) as exc:  # pyarrow: ValueError, OSError
        yield shown, f"cannot be read as {kind}: {type(exc).__name__}: {exc}"


def _is_json_array(path: str) -> bool:
    try:
        with open_regular(path) as handle:
            return handle.read(4096).lstrip()[:1] == b"["
    except OSError:
        return False


def _python_size(value: Any, depth: int = 0) -> int:
    """About how many bytes a parsed JSON or CSV row holds (text by its length, anything
    else 8); the nesting is bounded by the JSON reader's depth bound."""
    if isinstance(value, str):
        return len(value)
    if isinstance(value, Mapping):
        return sum(len(str(k)) + _python_size(v, depth + 1) for k, v in value.items())
    if isinstance(value, list):
        return 8 + sum(_python_size(v, depth + 1) for v in value)
    return 8


def _json_array_rows(path: str, shown: str, limit: RowLimit) -> Rows:
    """A ``.json`` file holding one array of objects (parsed whole, so bounded in size)."""
    with open_regular(path) as handle:
        size = os.fstat(handle.fileno()).st_size
        raw = handle.read(MAX_JSON_ARRAY_BYTES + 1) if size <= MAX_JSON_ARRAY_BYTES else b""
    if size > MAX_JSON_ARRAY_BYTES or len(raw) > MAX_JSON_ARRAY_BYTES:
        yield (
            shown,
            f"is one JSON array of {max(size, len(raw)):,} bytes, more than the "
            f"{MAX_JSON_ARRAY_BYTES:,} parsed whole; write it as JSON lines (one object "
            "per line), which is streamed",
        )
        return
    data = safe_json.loads(raw.decode("utf-8"))
    if not isinstance(data, list):
        yield (
            shown,
            f"holds a JSON {type(data).__name__}; task=dataset reads an array of objects "
            "or JSON lines",
        )
        return
    for index, record in enumerate(data):
        where = f"{shown}:row {index}"
        if not isinstance(record, dict):
            yield where, f"expected a JSON object, got {type(record).__name__}"
            continue
        size = _python_size(record)
        yield where, limit.refusal(size) if size > limit.bytes else record


#: What a CSV line longer than the row bound is replaced by (its row is then refused).
_CUT = "art_hydra: this line was past the row bound"


def _bounded_lines(text: Any, limit: RowLimit) -> Iterator[str]:
    """``text``'s lines, each read no further than the row limit; a longer one is
    skipped to its end, holding none of it, and given to the CSV reader as :data:`_CUT`
    and its size in characters."""
    while line := text.readline(limit.bytes + 1):
        if len(line) > limit.bytes and not line.endswith("\n"):
            size = len(line)
            while rest := text.readline(1 << 20):
                size += len(rest)
                if rest.endswith("\n"):
                    break
            yield f"{_CUT} {size}\n"
            continue
        yield line


def _csv_rows(path: str, shown: str, limit: RowLimit) -> Rows:
    """CSV (or TSV) rows with their header's names, every cell text; named ``file:line``.
    Each physical line and each cell is bounded by the row limit before it is split."""
    csv.field_size_limit(max(limit.bytes, 1))
    delimiter = "\t" if _format(shown) == "tsv" or _format(path) == "tsv" else ","
    with (
        open_regular(path) as raw,
        open(raw.fileno(), encoding="utf-8-sig", newline="", closefd=False) as text,
    ):
        reader = csv.DictReader(_bounded_lines(text, limit), delimiter=delimiter)
        start = 2
        for record in reader:
            where = f"{shown}:{start}"
            size = _python_size(dict(record))
            cut = [v for v in record.values() if isinstance(v, str) and _CUT in v]
            if cut:
                found = re.search(re.escape(_CUT) + r" (\d+)", cut[0])
                yield where, limit.refusal(int(found.group(1)) if found else limit.bytes + 1)
            elif size > limit.bytes:
                yield where, limit.refusal(size)
            elif None in record:
                yield where, "has more cells than the header has names"
            else:
                yield where, record
            start = reader.line_num + 1


# ---- Arrow and parquet, bounded before they decode ---------------------------------------


def _type_refusal(schema: Any) -> str | None:
    """Why a file's columns cannot be read within bounds (None: they can): too many, or a
    type whose values are not laid out one after another (dictionary, run-end encoded,
    view and union types let a few bytes stand for a great many values)."""
    import pyarrow as pa

    if len(schema) > MAX_COLUMNS:
        return f"has {len(schema):,} columns, more than the {MAX_COLUMNS:,} read"
    pending = [(f.name, f.type) for f in schema]
    while pending:
        name, kind = pending.pop()
        if pa.types.is_struct(kind):
            pending += [(f"{name}.{f.name}", f.type) for f in kind]
        elif pa.types.is_list(kind) or pa.types.is_large_list(kind):
            pending.append((f"{name}[]", kind.value_type))
        elif pa.types.is_fixed_size_list(kind) or pa.types.is_map(kind):
            pending.append(
                (
                    f"{name}[]",
                    kind.value_type
                    if not pa.types.is_map(kind)
                    else pa.struct([("key", kind.key_type), ("value", kind.item_type)]),
                )
            )
        elif not (
            pa.types.is_null(kind)
            or pa.types.is_boolean(kind)
            or pa.types.is_integer(kind)
            or pa.types.is_floating(kind)
            or pa.types.is_decimal(kind)
            or pa.types.is_temporal(kind)
            or pa.types.is_string(kind)
            or pa.types.is_large_string(kind)
            or pa.types.is_binary(kind)
            or pa.types.is_large_binary(kind)
            or pa.types.is_fixed_size_binary(kind)
        ):
            return (
                f"has the column {name!r} of the Arrow type {kind}, which task=dataset does not "
                "read (dictionary, run-end encoded, view and union values can stand for far "
                "more data than the file holds); write it as plain values"
            )
    return None


def _arrow_size(array: Any) -> int:
    """The bytes ``array``'s values make once they are Python values (text by its length,
    anything else 8), computed in Arrow without making them."""
    import pyarrow as pa
    import pyarrow.compute as pc

    kind = array.type
    if pa.types.is_struct(kind):
        return 8 * len(array) + sum(_arrow_size(child) for child in array.flatten())
    if (
        pa.types.is_list(kind)
        or pa.types.is_large_list(kind)
        or pa.types.is_fixed_size_list(kind)
        or pa.types.is_map(kind)
    ):
        return 8 * len(array) + _arrow_size(array.flatten())
    if (
        pa.types.is_string(kind)
        or pa.types.is_large_string(kind)
        or pa.types.is_binary(kind)
        or (pa.types.is_large_binary(kind) or pa.types.is_fixed_size_binary(kind))
    ):
        return 8 * len(array) + int(pc.sum(pc.binary_length(array)).as_py() or 0)
    return 8 * len(array)


def _checked_rows(batch: Any, shown: str, first: int, limit: RowLimit) -> Rows:
    """A record batch's rows as Python values, each refused first (by its size measured
    in Arrow, :func:`_arrow_size`) when larger than ``limit``: no oversized row is ever
    made into Python values."""
    sizes = [_arrow_size(column) for column in batch.columns]
    if sum(sizes) <= limit.bytes:
        for offset, record in enumerate(batch.to_pylist()):
            yield f"{shown}{first + offset}", record
        return
    for offset in range(batch.num_rows):
        row = batch.slice(offset, 1)
        size = sum(_arrow_size(column) for column in row.columns)
        where = f"{shown}{first + offset}"
        yield where, limit.refusal(size) if size > limit.bytes else row.to_pylist()[0]


def _parquet_footer_refusal(path: str) -> str | None:
    """Why a parquet file's footer is not read (None: it is small enough to be)."""
    with open_regular(path) as handle:
        size = os.fstat(handle.fileno()).st_size
        if size < 12:
            return f"is {size} bytes, too short for a parquet file"
        handle.seek(size - 8)
        length, magic = struct.unpack("<I4s", handle.read(8))
    if magic != b"PAR1":
        return "does not end as a parquet file does (no PAR1 mark)"
    if length > min(MAX_PARQUET_FOOTER_BYTES, size - 12):
        return (
            f"declares a {length:,}-byte footer in a {size:,}-byte file (at most "
            f"{MAX_PARQUET_FOOTER_BYTES:,} read)"
        )
    return None


def _parquet_bounds(meta: Any) -> tuple[str | None, int]:
    """(why the file's row groups cannot be decoded within bounds, or None; the largest
    row group's decompressed bytes), from the footer alone."""
    if meta.num_rows > MAX_FILE_ROWS:
        return f"declares {meta.num_rows:,} rows, more than the {MAX_FILE_ROWS:,} read", 0
    if meta.num_columns > MAX_COLUMNS:
        return f"has {meta.num_columns:,} columns, more than the {MAX_COLUMNS:,} read", 0
    largest = 0
    for index in range(meta.num_row_groups):
        group = meta.row_group(index)
        chunks = [group.column(c) for c in range(group.num_columns)]
        decoded = max(group.total_byte_size, sum(c.total_uncompressed_size for c in chunks))
        stored = sum(c.total_compressed_size for c in chunks)
        if decoded > MAX_ROW_GROUP_BYTES:
            return (
                f"has a row group (#{index}) of {decoded:,} bytes once decompressed "
                f"({stored:,} bytes stored), more than the {MAX_ROW_GROUP_BYTES:,} bytes "
                "task=dataset decodes at once; rewrite it with smaller row groups "
                "(pyarrow.parquet.write_table(..., row_group_size=...)) or with shorter rows",
                0,
            )
        values = max((c.num_values for c in chunks), default=0)
        if values > MAX_ROW_GROUP_VALUES:
            return (
                f"has a row group (#{index}) of {values:,} values in one column, more than "
                f"the {MAX_ROW_GROUP_VALUES:,} task=dataset decodes at once",
                0,
            )
        largest = max(largest, decoded)
    return None, largest


def _parquet_rows(path: str, shown: str, limit: RowLimit) -> Rows:
    """Parquet rows, read only once its footer shows every row group decodes within
    :data:`MAX_ROW_GROUP_BYTES`, in batches small enough that even rows as large as a
    row group stay within :data:`MAX_BATCH_BYTES`."""
    import pyarrow.parquet as pq

    refused = _parquet_footer_refusal(path)
    if refused is not None:
        yield shown, refused
        return
    parquet = pq.ParquetFile(path, memory_map=True)  # a regular file: checked just above
    refused, largest = _parquet_bounds(parquet.metadata)
    refused = refused or _type_refusal(parquet.schema_arrow)
    if refused is not None:
        yield shown, refused
        return
    rows = max(1, min(BATCH_ROWS, MAX_BATCH_BYTES // max(largest, 1)))
    index = 0
    for batch in parquet.iter_batches(batch_size=rows):
        yield from _checked_rows(batch, f"{shown}:row ", index, limit)
        index += batch.num_rows


def _arrow_rows(path: str, shown: str, limit: RowLimit) -> Rows:
    """Arrow (IPC stream or file) rows, memory-mapped, a slice of :data:`BATCH_ROWS` at a
    time, once :func:`_arrow_refusal` found nothing compressed or hidden."""
    import pyarrow as pa

    refused = _arrow_refusal(path)
    if refused is not None:
        yield shown, refused
        return
    with pa.memory_map(path) as source:
        try:
            reader: Any = pa.ipc.open_stream(source)
            batches = iter(reader)
        except pa.ArrowInvalid:
            source.seek(0)
            reader = pa.ipc.open_file(source)
            batches = (reader.get_batch(i) for i in range(reader.num_record_batches))
        refused = _type_refusal(reader.schema)
        if refused is not None:
            yield shown, refused
            return
        index = 0
        for batch in batches:
            for start in range(0, batch.num_rows, BATCH_ROWS):
                part = batch.slice(start, BATCH_ROWS)
                yield from _checked_rows(part, f"{shown}:row ", index, limit)
                index += part.num_rows


def _flat_field(data: bytes, table: int, index: int) -> int | None:
    """Where field ``index`` of the flatbuffer table at ``table`` is (None: absent)."""
    vtable = table - struct.unpack_from("<i", data, table)[0]
    (vtable_size,) = struct.unpack_from("<H", data, vtable)
    slot = 4 + 2 * index
    if slot + 2 > vtable_size:
        return None
    (offset,) = struct.unpack_from("<H", data, vtable + slot)
    return table + offset if offset else None


def _flat_table(data: bytes, at: int) -> int:
    return at + struct.unpack_from("<I", data, at)[0]


def _batch_compressed(metadata: bytes) -> bool:
    """Whether an IPC message (a record or dictionary batch, Arrow's ``Message`` table)
    declares compressed buffers (``RecordBatch.compression``, field 3)."""
    root = _flat_table(metadata, 0)
    kind_at, header_at = _flat_field(metadata, root, 1), _flat_field(metadata, root, 2)
    kind = metadata[kind_at] if kind_at is not None else 0
    if header_at is None or kind not in (2, 3):  # DictionaryBatch, RecordBatch
        return False
    header = _flat_table(metadata, header_at)
    if kind == 2:
        data_at = _flat_field(metadata, header, 1)
        if data_at is None:
            return False
        header = _flat_table(metadata, data_at)
    return _flat_field(metadata, header, 3) is not None


def _arrow_refusal(path: str) -> str | None:
    """Why an Arrow IPC file is not read (None: it is): a compressed record batch (LZ4 or
    ZSTD buffers decompress to any size, whatever the file weighs; ``save_to_disk``
    never writes them). Only the messages' headers are read, memory-mapped."""
    import pyarrow as pa

    from art_hydra.safe_paths import file_refusal

    refused = file_refusal(path)
    if refused is not None:
        return refused
    try:
        with pa.memory_map(path) as source:
            whole = source.read_buffer()
            body = whole.slice(8) if whole[:6].to_pybytes() == b"ARROW1" else whole
            for message in pa.ipc.MessageReader.open_stream(pa.BufferReader(body)):
                if message.type in ("record batch", "dictionary batch") and _batch_compressed(
                    message.metadata.to_pybytes()
                ):
                    return (
                        "holds compressed record batches (LZ4 or ZSTD buffers, which "
                        "decompress to any size); write it uncompressed, or as parquet"
                    )
    except (pa.ArrowInvalid, OSError, ValueError, struct.error, IndexError) as exc:
        return f"cannot be read as Arrow: {type(exc).__name__}: {exc}"
    return None
