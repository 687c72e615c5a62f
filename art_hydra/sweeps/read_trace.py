"""A check's verdict, remembered by the config values it read.

A sweep's points share one resolved config per group selection and differ in a few
values, so most validators and world checks see, at most points, exactly what they saw
before. Declaring what each reads by hand would drift from the code; instead a check is
run once while every read of a config node is recorded (OmegaConf reaches every child,
through attributes, ``select``, ``to_container`` or interpolations, by ``_get_node``; a
container's text reads it whole), and its verdict is kept under the values of the leaves
it read. A later point whose leaves hold the same values gets the same verdict: a check
is a function of what it reads, and reads the same things in the same order when those
return the same values.

What this leans on, each guarded: the tree's shape (its containers, their content and
keys) is the same at every point (a point that changes it is checked for real); a list
is read as a whole (its iteration bypasses ``_get_node``); a read of a copy
(``deepcopy``, ``OmegaConf.merge``, ``OmegaConf.create``) is a read of what it was copied
from, and a shallow copy or a pickle reads all of it; a check that writes into the tree,
or reads a node hanging from it that is no copy of it, is never remembered, nor is any
check after one that wrote at that point; a read from a thread that is not tracing counts
for the check that is running. Everything else a check may read
(the user's hand, the launch plan, the files on disk) is fixed for the length of one
sweep's pre-flight. The OmegaConf internals this needs live in
:mod:`art_hydra.config.hydra_compat`.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

from omegaconf import DictConfig, ListConfig

from art_hydra.config.hydra_compat import (
    TRACE_WHOLE,
    TRACE_WRITE,
    CopyOf,
    node_children,
    node_is_special,
    node_key,
    node_parent,
    node_value,
    traced_reads,
)

_MISS = object()
#: Where a node lies: the keys from the root to it.
Path = tuple[Any, ...]


class Tree:
    """One resolved config: where each container sits, and the value of every leaf."""

    def __init__(self, cfg: DictConfig) -> None:
        self.cfg = cfg
        #: id(container) -> (path prefix of its children, or the whole list it lies in).
        #: A path is the tuple of keys from the root, so that an int key ``1`` and a
        #: str key ``"1"``, or a key ``"a.b"`` and a section ``a`` holding ``b``, differ.
        self.places: dict[int, tuple[Path, bool]] = {}
        #: Each indexed container's children (its content dict) and how many it holds.
        self._contents: list[tuple[dict, int]] = []
        #: (parent's content, key, node, its content): the sections that must stay in place,
        #: holding the same content object (set to None, ``???``, an interpolation or a new
        #: dict, a section keeps its node and swaps that object).
        self._sections: list[tuple[dict | None, Any, Any, Any]] = []
        #: (content dict, key, container node): the leaf containers that must stay in place.
        self._containers: list[tuple[dict, Any, Any]] = []
        #: (path, content dict, key) of every leaf, a list being one leaf.
        self._leaves: list[tuple[Path, dict, Any]] = []
        #: The containers in lists (the others are held by ``_sections``).
        self._held: list[Any] = []
        self._index(cfg, (), None, None)
        self.base: dict[Path, Any] = self.snapshot() or {}
        #: Every section's prefix and every leaf's path, in order: two trees alike in this
        #: read the same leaves for the same reads.
        self.shape = (tuple(self.places.values()), tuple(self.base))

    def _index(self, node: DictConfig, prefix: Path, parent: dict | None, key: Any) -> None:
        self.places[id(node)] = (prefix, False)
        content = node_children(node)  # untraced, unresolved
        self._sections.append((parent, key, node, content))
        self._contents.append((content, len(content)))
        for key, child in content.items():
            path = (*prefix, key)
            if isinstance(child, DictConfig) and not node_is_special(child):
                self._index(child, path, content, key)
            else:
                if isinstance(child, (DictConfig, ListConfig)):
                    self._containers.append((content, key, child))
                    self._index_list(child, path)
                self._leaves.append((path, content, key))

    def snapshot(self) -> dict[Path, Any] | None:
        """Every leaf's value (a list is one leaf); None where the shape has changed."""
        try:
            if (
                any(len(c) != n for c, n in self._contents)
                or any(
                    (p is not None and p[k] is not node) or node_children(node) is not content
                    for p, k, node, content in self._sections
                )
                or any(c[k] is not node for c, k, node in self._containers)
            ):
                return None
            return {path: _signature(content[key]) for path, content, key in self._leaves}
        except KeyError:
            return None

    def _index_list(self, node: Any, path: Path) -> None:
        self.places[id(node)] = (path, True)
        self._held.append(node)  # placed by id: kept alive, so no other node takes its id
        if node_is_special(node):
            return
        content = node_children(node)
        for child in content.values() if isinstance(content, dict) else content:
            if isinstance(child, (DictConfig, ListConfig)):
                self._index_list(child, path)

    def paths(self, reads: list[tuple[Any, Any]]) -> tuple[Path, ...] | None:
        """The leaves ``reads`` reached (None: the check wrote into the tree, or read
        through a node hanging from it that is no copy of it). A read of a copy is a read
        of what it was copied from; a container or an absent key is no leaf (the shape is
        the same at every point); a container read as a whole (its text) reached every
        leaf under it; a write into another config, or into a copy, is no write here."""
        # A copy's sources: more than one where a section was assigned into a copy
        # (a typed section is filled in place), each then counted.
        copies: dict[int, list[Any]] = {}
        for container, key in reads:
            if isinstance(key, CopyOf) and id(container) not in self.places:
                copies.setdefault(id(container), []).append(key.source)
        found: dict[Path, None] = {}
        for read, key in reads:
            if isinstance(key, CopyOf) or (key is TRACE_WRITE and id(read) in copies):
                continue  # a write into a copy is none into the tree
            for container in _origins(read, copies):
                place = self.places.get(id(container)) if container is not None else None
                if place is None:
                    if key is not TRACE_WRITE and container is not None and self._copied(container):
                        return None
                    continue  # another config altogether
                if key is TRACE_WRITE:
                    return None
                prefix, whole = place
                if key is TRACE_WHOLE and not whole:
                    size = len(prefix)
                    found.update(dict.fromkeys(p for p in self.base if p[:size] == prefix))
                    continue
                path = prefix if whole else (*prefix, key)
                if not whole and path not in self.base:
                    path = (*prefix, node_key(container, key))  # an Enum key read by its name
                if path in self.base:
                    found[path] = None
        return tuple(found)

    def wrote(self, reads: list[tuple[Any, Any]]) -> bool:
        """Whether ``reads`` hold a write into this tree (not into a copy or another)."""
        return any(
            key is TRACE_WRITE and container is not None and id(container) in self.places
            for container, key in reads
        )

    def _copied(self, container: Any) -> bool:
        parent = node_parent(container)
        while parent is not None:
            if id(parent) in self.places:
                return True
            parent = node_parent(parent)
        return False


def _origins(node: Any, copies: dict[int, list[Any]]) -> list[Any]:
    """What a read of ``node`` reads: ``node`` itself, or, for a copy, every node it was
    copied from that is no copy itself (copies of copies followed, loops cut)."""
    if id(node) not in copies:
        return [node]
    found, seen, todo = [], {id(node)}, list(copies[id(node)])
    while todo:
        source = todo.pop()
        if id(source) in seen:
            continue
        seen.add(id(source))
        if id(source) in copies:
            todo.extend(copies[id(source)])
        else:
            found.append(source)
    return found


def _signature(node: Any) -> Any:
    """A leaf's value as written, with its type (``1``, ``1.0`` and ``True`` differ, and
    so do ``0.0`` and ``-0.0``, which compare equal but print apart); a container's whole
    content, with its kind (an empty list is no empty dict)."""
    if isinstance(node, DictConfig) and not node_is_special(node):
        return (dict, tuple((k, _signature(c)) for k, c in node_children(node).items()))
    if isinstance(node, ListConfig) and not node_is_special(node):
        return (list, tuple(_signature(c) for c in node_children(node)))
    value = node_value(node)
    if isinstance(value, float):
        return (float, repr(value))  # NaN too: one key that equals itself
    return (type(value), value)


class Memo:
    """Verdicts of named checks on one :class:`Tree`, by the values their reads returned."""

    def __init__(self, tree: Tree) -> None:
        self.tree = tree
        #: name -> reads (paths) -> their values -> verdict.
        self.kept: dict[str, dict[tuple[Path, ...], dict[tuple, Any]]] = {}
        #: Checks found writing into the tree or reading a copy of it: always run.
        self.never: set[str] = set()
        #: Checks found writing into the tree: once one runs, the point's values may differ
        #: from its snapshot, so nothing more is remembered for that point.
        self.writers: set[str] = set()
        #: The current point's leaves (None: its shape differs or a check wrote into it;
        #: nothing is remembered).
        self.leaves: dict[Path, Any] | None = None
        #: Verdicts found at the current point, kept once the point proves unwritten.
        self.fresh: list[tuple[str, tuple[Path, ...], tuple, Any]] = []
        self.hits = 0

    def begin(self) -> None:
        """A new point: read its leaves once. Where its shape has changed (a section set to
        null and back swaps the section's content), the tree is indexed again, and
        verdicts still hold if it is again the shape they were found on."""
        self.leaves = self.tree.snapshot()
        if self.leaves is None:
            again = Tree(self.tree.cfg)
            if again.shape == self.tree.shape:
                self.tree, self.leaves = again, again.base
        self.fresh = []

    def end(self) -> None:
        """Keep the point's new verdicts (none where a check wrote into the tree)."""
        for name, paths, values, verdict in self.fresh:
            self.kept.setdefault(name, {}).setdefault(paths, {})[values] = verdict
        self.fresh = []

    def _written(self) -> None:
        """A check wrote into the tree: the snapshot no longer tells what later checks read."""
        self.leaves = None
        self.fresh = []

    def call(self, name: str, fn: Callable[[], list[Any]]) -> list[Any]:
        """``fn()`` (its verdict as a list), or the verdict it gave on the same reads."""
        leaves = self.leaves
        if leaves is None or name in self.never:
            verdict = fn()
            if name in self.writers:
                self._written()
            return verdict
        for paths, verdicts in self.kept.get(name, {}).items():
            found = verdicts.get(tuple(leaves[p] for p in paths), _MISS)
            if found is not _MISS:
                self.hits += 1
                return list(found)
        with traced_reads() as reads:
            try:
                verdict = fn()
            except BaseException:
                self._judge(name, reads)  # a crash is not remembered; a write still counts
                raise
        paths = self._judge(name, reads)
        if paths is not None:
            values = tuple(leaves[p] for p in paths)
            self.fresh.append((name, paths, values, tuple(verdict)))
        return verdict

    def _judge(self, name: str, reads: list[tuple[Any, Any]]) -> tuple[Path, ...] | None:
        """The leaves ``name`` read, or None when it may never be remembered."""
        paths = self.tree.paths(reads)
        if paths is None:
            self.never.add(name)
            if self.tree.wrote(reads):
                self.writers.add(name)
                self._written()
        return paths
