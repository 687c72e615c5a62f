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
over a large dataset keeps only its statistics. The ``datasets`` library (and pyarrow)
are imported inside the functions that read, and neither imports torch.

Each row becomes an :class:`Example` by TRL's formats (see :func:`row_example`).
"""

from __future__ import annotations

import csv
import os
from collections.abc import Iterator, Mapping
from dataclasses import dataclass
from typing import Any

from art_hydra import model_files, safe_json
from art_hydra.safe_paths import open_regular
from art_hydra.tasks.examples import Example, not_text
from art_hydra.tasks.jsonl import iter_records

#: Roles a message may have (OpenAI's and TRL's chat roles).
ROLES = ("system", "developer", "user", "assistant", "tool")
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
MAX_JSON_ARRAY_BYTES = 256 << 20


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
    """TRL's conversational value (a list of {role, content}) as pairs, or why not."""
    if not value:
        return f"'{column}' is an empty list of messages"
    pairs = []
    for i, message in enumerate(value):
        at = f"'{column}'[{i}]"
        if not isinstance(message, Mapping):
            return f"{at} must be a {{role, content}} object, not {type(message).__name__}"
        role, content = message.get("role"), message.get("content")
        if role not in ROLES:
            return f"{at} has the role {role!r}; a message's role is one of {', '.join(ROLES)}"
        if isinstance(content, list):
            return (
                f"{at} has its content as a list of parts (TRL's multimodal format: images, "
                "audio); art_hydra trains text models, so a message's content must be a string"
            )
        reason = not_text(content, optional=False)
        if reason is not None:
            return f"{at}'s content {reason}"
        pairs.append((role, content))
    return tuple(pairs)


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


def row_example(
    record: Mapping[str, Any], columns: Columns, needed_by: str | None
) -> Example | BadRow:
    """One row in TRL's formats as an :class:`Example`, or why it cannot be one.

    - ``prompt`` (``task.columns.prompt``): text (standard) or a list of
      ``{role, content}`` messages (conversational), with an optional answer column
      (``completion``, text or assistant messages; see :func:`_answer`);
    - else ``messages`` (``task.columns.messages``): a whole conversation, its last
      assistant turn the answer.

    Every column but the prompt, the messages and TRL's ``completion`` is kept in
    :attr:`Example.columns`, under its own name, for the rewards (a mapped answer column
    such as ``solution`` stays there too, as TRL passes it)."""
    present = list(record)
    if columns.prompt in record:
        prompt = _prompt(record[columns.prompt], columns.prompt)
        if isinstance(prompt, BadRow):
            return prompt
        answer = _answer(record, columns, needed_by)
        if isinstance(answer, BadRow):
            return answer
        text, pairs = prompt
    elif columns.messages in record:
        found = _conversation(record[columns.messages], columns.messages, needed_by)
        if isinstance(found, BadRow):
            return found
        text, pairs, answer = found
    else:
        return BadRow(
            f"has neither a '{columns.prompt}' column (task.columns.prompt) nor a "
            f"'{columns.messages}' column (task.columns.messages); its columns are "
            f"{', '.join(present) or 'none'}",
            {"task.columns.prompt": _guess(present, PROMPT_GUESSES)},
        )
    used = {columns.prompt, columns.messages, "completion"}
    kept = {k: v for k, v in record.items() if k not in used}
    return Example(prompt=text, answer=answer, messages=pairs, plain=not pairs, columns=kept)


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


def resolve_source(path: str) -> Source:
    """``task.path`` as a :class:`Source`; :class:`SourceError` when nothing is there."""
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
        return Source(path, files=_folder_files(local), base=local)
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
    return Source(path, files=_folder_files(snapshot), base=snapshot)


def _format(path: str) -> str | None:
    return FORMATS.get(os.path.splitext(path)[1].lower())


def _card_configs(folder: str) -> list[dict[str, Any]]:
    """The ``configs:`` a dataset card (README.md's YAML header) declares: how the hub and
    ``load_dataset`` group a repository's files into configs and splits."""
    import yaml

    try:
        with open(os.path.join(folder, "README.md"), encoding="utf-8") as handle:
            text = handle.read(1 << 20)
    except (OSError, UnicodeDecodeError):
        return []
    if not text.startswith("---"):
        return []
    header, _, _ = text[3:].partition("\n---")
    try:
        card = yaml.safe_load(header)
    except yaml.YAMLError:
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


def _folder_files(folder: str) -> dict[str, tuple[str, ...]]:
    """A folder's data files by split, as ``datasets`` splits a repository: by its card's
    one declared config, else by file name. A repository of several configs (gsm8k's
    ``main`` and ``socratic``) is refused rather than merged: each config is another
    dataset (other answers, other formats), and training on all of them at once is never
    what was meant."""
    from datasets.data_files import DataFilesDict, EmptyDatasetError, get_data_patterns
    from datasets.exceptions import DataFilesNotFoundError

    configs = _card_configs(folder)
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


def split_names(source: Source) -> list[str]:
    """The splits ``source`` has."""
    if source.files is not None:
        return list(source.files)
    return list(_load_saved(source.saved or "").keys())


def _load_saved(folder: str) -> Mapping[str, Any]:
    from datasets import Dataset, load_from_disk

    loaded = load_from_disk(folder)
    return {"train": loaded} if isinstance(loaded, Dataset) else loaded


def iter_rows(
    source: Source, split: str, max_line_bytes: int, limit_reason: str
) -> Iterator[tuple[str, Mapping[str, Any] | str]]:
    """Every row of ``split`` as ``(where, record or why it cannot be read)``, streamed."""
    if source.saved is not None:
        yield from _saved_rows(source.saved, split)
        return
    for path in (source.files or {}).get(split, ()):
        shown = os.path.relpath(path, source.base) if source.base else path
        yield from _file_rows(path, shown, max_line_bytes, limit_reason)


def _saved_rows(folder: str, split: str) -> Iterator[tuple[str, Mapping[str, Any] | str]]:
    try:
        dataset = _load_saved(folder)[split]
    except Exception as exc:  # a damaged save: its state files or Arrow shards
        yield folder, f"cannot be read with datasets.load_from_disk: {type(exc).__name__}: {exc}"
        return
    index = 0
    for batch in dataset.iter(batch_size=BATCH_ROWS):
        names = list(batch)
        for values in zip(*(batch[n] for n in names), strict=True):
            yield f"{split}:{index}", dict(zip(names, values, strict=True))
            index += 1


def _file_rows(
    path: str, shown: str, max_line_bytes: int, limit_reason: str
) -> Iterator[tuple[str, Mapping[str, Any] | str]]:
    kind = _format(path)
    if kind == "json" and not _is_json_array(path):
        kind = "jsonl"
    if kind == "jsonl":
        for where, record in iter_records(
            path, max_line_bytes=max_line_bytes, limit_reason=limit_reason
        ):
            yield shown + where[len(path) :], record
        return
    reader = {"json": _json_array_rows, "csv": _csv_rows, "tsv": _csv_rows}.get(
        kind or "", _arrow_rows
    )
    try:
        yield from reader(path, shown, max_line_bytes)
    except (OSError, ValueError, csv.Error) as exc:  # pyarrow's errors are ValueErrors or OSErrors
        yield shown, f"cannot be read as {kind}: {type(exc).__name__}: {exc}"


def _is_json_array(path: str) -> bool:
    try:
        with open_regular(path) as handle:
            return handle.read(4096).lstrip()[:1] == b"["
    except OSError:
        return False


def _json_array_rows(
    path: str, shown: str, _limit: int
) -> Iterator[tuple[str, Mapping[str, Any] | str]]:
    """A ``.json`` file holding one array of objects (parsed whole, so bounded in size)."""
    size = os.stat(path).st_size
    if size > MAX_JSON_ARRAY_BYTES:
        yield (
            shown,
            (
                f"is one JSON array of {size:,} bytes, more than the "
                f"{MAX_JSON_ARRAY_BYTES:,} parsed whole; write it as JSON lines (one object "
                "per line), which is streamed"
            ),
        )
        return
    with open_regular(path) as handle:
        data = safe_json.loads(handle.read().decode("utf-8"))
    if not isinstance(data, list):
        yield (
            shown,
            f"holds a JSON {type(data).__name__}; task=dataset reads an array of objects "
            "or JSON lines",
        )
        return
    for index, record in enumerate(data):
        ok = isinstance(record, dict)
        yield (
            f"{shown}:row {index}",
            record if ok else f"expected a JSON object, got {type(record).__name__}",
        )


def _csv_rows(path: str, shown: str, limit: int) -> Iterator[tuple[str, Mapping[str, Any] | str]]:
    """CSV (or TSV) rows with their header's names, every cell text; named ``file:line``."""
    csv.field_size_limit(max(limit, csv.field_size_limit()))
    delimiter = "\t" if path.lower().endswith(".tsv") else ","
    with (
        open_regular(path) as raw,
        open(raw.fileno(), encoding="utf-8-sig", newline="", closefd=False) as text,
    ):
        reader = csv.DictReader(text, delimiter=delimiter)
        start = 2
        for record in reader:
            if None in record:
                yield f"{shown}:{start}", "has more cells than the header has names"
            else:
                yield f"{shown}:{start}", record
            start = reader.line_num + 1


def _arrow_rows(
    path: str, shown: str, _limit: int
) -> Iterator[tuple[str, Mapping[str, Any] | str]]:
    """Parquet or Arrow rows, a batch of :data:`BATCH_ROWS` at a time."""
    import pyarrow as pa
    import pyarrow.parquet as pq

    if path.lower().endswith(".parquet"):
        batches = pq.ParquetFile(path).iter_batches(batch_size=BATCH_ROWS)
    else:
        try:
            batches = iter(pa.ipc.open_stream(path))
        except pa.ArrowInvalid:
            reader = pa.ipc.open_file(path)
            batches = (reader.get_batch(i) for i in range(reader.num_record_batches))
    index = 0
    for batch in batches:
        for record in batch.to_pylist():
            yield f"{shown}:row {index}", record
            index += 1
