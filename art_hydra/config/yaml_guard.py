"""Config files are read within bounds, where Hydra reads them.

A YAML alias repeats a node by reference; OmegaConf copies every repetition, so nine
levels of ten aliases (a "billion laughs" file of a few hundred bytes) would make
composition run until memory runs out. Every YAML file Hydra reads while composing goes
through :func:`read_text_bounded` and :func:`text_refusal` at the point Hydra reads it
(:func:`art_hydra.config.hydra_compat.guard_config_reads`): a regular file, its size
bounded, its node graph built without constructing anything (``yaml.compose``) and the
size it would expand to counted once per distinct node. Linked files, search-path
folders and defaults entries are read the same way. A file too large or nested too
deep is one problem, named by its path, and nothing is composed.
:func:`config_file_problems` also measures a whole ``--config-dir`` up front, so every
such file in it is named in one report.
"""

from __future__ import annotations

import os
import re
import sys
from pathlib import Path
from typing import Any

import yaml

from art_hydra.config.problems import Kind, Problem, fix

#: Nodes a config file may expand to: far beyond any real config, far below a bomb.
MAX_NODES = 200_000
#: Bytes of one config file.
MAX_BYTES = 4 << 20
#: YAML files looked at in one folder (a config folder is small).
MAX_FILES = 10_000


def _expanded_size(node: yaml.Node, seen: dict[int, int], budget: int) -> int:
    """The number of nodes ``node`` expands to, stopping once past ``budget``."""
    known = seen.get(id(node))
    if known is not None:
        return known
    total = 1
    if isinstance(node, yaml.SequenceNode):
        children = node.value
    elif isinstance(node, yaml.MappingNode):
        children = [part for pair in node.value for part in pair]
    else:
        children = []
    for child in children:
        total += _expanded_size(child, seen, budget)
        if total > budget:
            break
    seen[id(node)] = total
    return total


class YamlRefused(ValueError):
    """A YAML file that cannot be read within the bounds; ``str`` names the file and why."""

    def __init__(self, path: str | os.PathLike, reason: str) -> None:
        super().__init__(f"{os.fspath(path)} {reason}")
        self.path = os.fspath(path)
        self.reason = reason


def read_text_bounded(path: str | os.PathLike, max_bytes: int = MAX_BYTES) -> str:
    """The text of the regular file ``path``, read no further than ``max_bytes``: a FIFO,
    a device or a folder is refused without blocking (:func:`safe_paths.open_regular`),
    and a file that grew past the bound while being read is refused too."""
    from art_hydra.safe_paths import RefusedFile, open_regular

    try:
        with open_regular(path) as handle:
            data = handle.read(max_bytes + 1)
    except RefusedFile as exc:
        raise YamlRefused(path, exc.strerror) from None
    except OSError as exc:
        raise YamlRefused(path, f"cannot be read: {exc.strerror or exc}") from None
    if len(data) > max_bytes:
        raise YamlRefused(path, f"is more than {max_bytes:,} bytes, more than a YAML record may be")
    try:
        return data.decode("utf-8")
    except UnicodeDecodeError as exc:
        raise YamlRefused(path, f"is not UTF-8 text ({exc.reason} at byte {exc.start})") from None


def load_bounded(path: str | os.PathLike, max_bytes: int = MAX_BYTES) -> Any:
    """The YAML file ``path`` loaded by OmegaConf, only once it is known to be within the
    bounds (size, nesting, alias expansion): every record file a command reads (a run's
    ``run_config.yaml``, a sweep's ``multirun.yaml``) comes through here. Raises
    :class:`YamlRefused` naming the file and the bound."""
    from omegaconf import OmegaConf

    text = read_text_bounded(path, max_bytes)
    why = text_refusal(text)
    if why is not None:
        raise YamlRefused(path, why)
    try:
        return OmegaConf.create(text)
    except Exception as exc:  # a syntax error: OmegaConf's message names the position
        raise YamlRefused(path, f"is not a YAML mapping: {exc}".rstrip()) from None


def file_refusal(path: Path) -> str | None:
    """Why the YAML file ``path`` cannot be composed safely (None: it can)."""
    try:
        text = read_text_bounded(path)
    except YamlRefused as exc:
        return exc.reason
    return text_refusal(text)


def text_refusal(text: str) -> str | None:
    """Why YAML ``text`` cannot be loaded safely (None: it can): nested too deeply, or
    expanding through aliases past :data:`MAX_NODES`."""
    if _surely_within(text):
        return None
    limit = sys.getrecursionlimit()
    try:
        sys.setrecursionlimit(max(limit, 4000))
        root = yaml.compose(text, Loader=yaml.SafeLoader)
        if root is None:
            return None
        nodes = _expanded_size(root, {}, MAX_NODES)
    except RecursionError:
        return "is nested too deeply to be read"
    except yaml.YAMLError:
        return None  # Hydra reports the syntax error itself, with its position
    finally:
        sys.setrecursionlimit(limit)
    if nodes > MAX_NODES:
        return (
            f"expands to more than {MAX_NODES:,} values through YAML aliases (*name): "
            "composing it would exhaust memory"
        )
    return None


#: Flow brackets (not a ``${`` interpolation) in a text.
_FLOW = re.compile(r"(?<!\$)[\[{]")


def _surely_within(text: str) -> bool:
    """Whether ``text`` is surely within the bounds without building its node graph
    (most config files, read at every composition): no anchor (so no alias can repeat
    anything) and a nesting depth bounded by its indentation and flow brackets."""
    if "&" in text or len(text) > MAX_BYTES:
        return False
    flow = len(_FLOW.findall(text))
    if flow > 64:
        return False
    indent = max((len(line) - len(line.lstrip(" -?")) for line in text.splitlines()), default=0)
    return indent + flow <= 96


def config_file_problems(*folders: str | None) -> list[Problem]:
    """One problem per YAML file under ``folders`` that cannot be composed safely."""
    problems: list[Problem] = []
    for folder in folders:
        if not folder or folder.startswith("pkg://") or not os.path.isdir(folder):
            continue
        for count, path in enumerate(sorted(Path(folder).rglob("*.y*ml"))):
            if count >= MAX_FILES:
                break
            why = file_refusal(path) if path.is_file() and not path.is_symlink() else None
            if why is not None:
                problems.append(
                    Problem(
                        str(path),
                        path.name,
                        f"this config file {why}.",
                        fix(note=f"repair or remove {path}"),
                        Kind.group,
                    )
                )
    return problems
