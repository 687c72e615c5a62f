"""Config files are read within bounds before Hydra composes them.

A YAML alias repeats a node by reference; OmegaConf copies every repetition, so nine
levels of ten aliases (a "billion laughs" file of a few hundred bytes) would make
composition run until memory runs out. Each YAML file of a user's config folder (and
of an absolute primary config path) is measured first: its node graph is built without
constructing anything (``yaml.compose``), and the size it would expand to is counted
once per distinct node. A file too large or nested too deep is one problem, named by
its path, and nothing is composed.
"""

from __future__ import annotations

import os
import sys
from pathlib import Path

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


def file_refusal(path: Path) -> str | None:
    """Why the YAML file ``path`` cannot be composed safely (None: it can)."""
    try:
        size = path.stat().st_size
        if size > MAX_BYTES:
            return f"is {size} bytes, more than a config file may be ({MAX_BYTES})"
        text = path.read_text(encoding="utf-8")
    except (OSError, UnicodeDecodeError) as exc:
        return f"cannot be read: {exc}"
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
