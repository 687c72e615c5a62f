"""Where the command imports code from: the environment, and from the working folder
only the modules the user named.

The folder a user runs ``art-hydra`` in is usually a data folder, and a data folder is
data: a ``yaml.py`` or ``numpy.py`` lying there must not replace the library, a
``hydra_plugins/`` there must not join Hydra's plugin scan, and a ``*.dist-info`` there
(hidden or not) must not add an entry point. So the command keeps the working folder off
``sys.path`` (``python -m`` puts it first) and makes importable from it only the
top-level modules the user named on the command line (a reward, a generator,
``task.allowed_modules``), through a finder placed after every other one: an installed
module of the same name always wins. A user who put the folder on ``PYTHONPATH`` chose
it by hand: every module there may be imported, still after the installed ones.

Standard library only: :mod:`art_hydra` imports this module before anything else, and
importing it leaves the launch folder.
"""

from __future__ import annotations

import contextlib
import importlib.abc
import importlib.machinery
import itertools
import os
import site
import sys
import sysconfig
from collections.abc import Iterable, Iterator, Sequence
from importlib.machinery import ModuleSpec
from pathlib import Path
from types import ModuleType

#: art_hydra's own code: the package, its Hydra plugin and its configs (``art_hydra.conf``,
#: a folder of its own in a source checkout).
_OWN = (
    Path(__file__).resolve().parent,
    Path(__file__).resolve().parent.parent / "hydra_plugins" / "art_hydra_preflight",
    Path(__file__).resolve().parent.parent / "conf",
)


def launched_as_command() -> bool:
    """Whether this process is the ``art-hydra`` command (``art-hydra ...`` or ``python
    -m art_hydra ...``, torchrun's ranks of either), not a program importing the package
    (whose import path is its own business)."""
    if os.path.basename(sys.argv[0] or "") == "art-hydra":
        return True
    argv = list(getattr(sys, "orig_argv", []))
    return any(a == "-m" and b == "art_hydra" for a, b in itertools.pairwise(argv))


def _same(path: str, folder: str) -> bool:
    try:
        return os.path.realpath(os.path.abspath(path or ".")) == os.path.realpath(folder)
    except (OSError, ValueError):
        return False


def _working_folder() -> str | None:
    try:
        return os.getcwd()
    except OSError:  # the folder was removed under the process
        return None


def leave_the_launch_folder() -> None:
    """Under the command, take the working folder off ``sys.path`` (``python -m`` put it
    first, ``PYTHONPATH=.`` anywhere); where ``PYTHONPATH`` named it, its modules stay
    importable, after the installed ones. Run from art_hydra's own source folder, nothing
    changes (that folder is the package, not data)."""
    cwd = _working_folder()
    if cwd is None or not launched_as_command() or _same(str(_OWN[0].parent), cwd):
        return
    chosen = [p for p in os.environ.get("PYTHONPATH", "").split(os.pathsep) if p]
    sys.path[:] = [p for p in sys.path if p not in ("", ".") and not _same(p, cwd)]
    if any(_same(p, cwd) for p in chosen):
        FINDER.allow(cwd, None)
    FINDER.install()


class _NamedInFolder(importlib.abc.MetaPathFinder):
    """Finds, last of all finders, the top-level modules named for a folder (every one
    for a folder given as ``None``: one the user put on ``PYTHONPATH``), and the modules
    of that folder that a module it found imports (a reward module's own helpers);
    records what it found, for the dry run's account."""

    def __init__(self) -> None:
        self.folders: dict[str, set[str] | None] = {}
        #: Top-level module name -> (folder, file), for each module this finder found.
        self.found: dict[str, tuple[str, str]] = {}

    def allow(self, folder: str, names: Iterable[str] | None) -> None:
        if names is None or self.folders.get(folder, set()) is None:
            self.folders[folder] = None
            return
        self.folders.setdefault(folder, set()).update(names)  # type: ignore[union-attr]

    def install(self) -> None:
        """Put this finder last (again, if something was appended after it)."""
        if self in sys.meta_path:
            sys.meta_path.remove(self)
        sys.meta_path.append(self)

    def find_spec(
        self, fullname: str, path: Sequence[str] | None = None, target: ModuleType | None = None
    ) -> ModuleSpec | None:
        if path is not None or "." in fullname:
            return None  # a submodule: its package's own path finds it
        importer = _importer()
        for folder, names in self.folders.items():
            sibling = self.found.get(importer, ("", ""))[0] == folder
            if names is not None and fullname not in names and not sibling:
                continue
            spec = importlib.machinery.PathFinder.find_spec(fullname, [folder])
            if spec is not None:
                self.found[fullname] = (folder, spec.origin or folder)
                return spec
        return None


def _importer() -> str:
    """The top-level name of the module whose code asked for the import being found
    (the import machinery's own frames skipped); ``""`` when none is found."""
    frame = sys._getframe(2)
    while frame is not None:
        name = str(frame.f_globals.get("__name__", ""))
        if not (name in ("importlib", __name__) or name.startswith("importlib.")):
            return name.partition(".")[0]  # (the frozen machinery is importlib._bootstrap)
        frame = frame.f_back  # type: ignore[assignment]
    return ""


#: The one finder of this process.
FINDER = _NamedInFolder()


def import_named_from(folder: str, names: Iterable[str]) -> None:
    """Make the top-level modules ``names`` importable from ``folder`` (after every
    installed module): the user named them on the command line."""
    names = {n for n in names if n.isidentifier()}
    if names:
        FINDER.allow(folder, names)
    FINDER.install()


def installed_locations() -> list[str]:
    """The entries of ``sys.path`` an installed distribution may live in: every one but
    the working folder (``''``, ``.`` or its path), which holds data, not installs."""
    cwd = _working_folder()
    return [
        p
        for p in sys.path
        if isinstance(p, str) and p not in ("", ".") and (cwd is None or not _same(p, cwd))
    ]


def _roots() -> tuple[list[Path], list[Path]]:
    """(the standard library's folders, the environment's install folders)."""
    paths = sysconfig.get_paths()
    stdlib = {paths.get("stdlib"), paths.get("platstdlib")}
    installed = {paths.get("purelib"), paths.get("platlib")}
    with contextlib.suppress(AttributeError):  # a virtualenv's old site.py lacks them
        installed |= {*site.getsitepackages(), site.getusersitepackages()}
    resolve = lambda ps: [Path(p).resolve() for p in ps if p]  # noqa: E731
    return resolve(stdlib), resolve(installed)


def outside_modules() -> Iterator[tuple[str, str]]:
    """Each imported module whose file lies outside art_hydra, the standard library and
    the environment's installed packages, as ``(name, file)``: under the command, every
    one in the process; in a program that imports art_hydra (whose own modules are its
    own), those this process imported from a folder the user named."""
    stdlib, installed = _roots()
    command = launched_as_command()
    for name, module in sorted(sys.modules.items()):
        if name in ("__main__", "__mp_main__") or not isinstance(module, ModuleType):
            continue
        if not command and name.partition(".")[0] not in FINDER.found:
            continue
        file = getattr(module, "__file__", None)
        if not isinstance(file, str) or not os.path.isabs(file):
            # built-in, frozen, a namespace package (no code of its own), or a module
            # that names a file it was not loaded from (torch.ops: "_ops.py"), which
            # resolving against the working folder would misplace there
            continue
        where = Path(file).resolve()
        if any(where.is_relative_to(root) for root in (*_OWN, *stdlib, *installed)):
            continue
        yield name, str(where)


leave_the_launch_folder()  # on import: art_hydra imports this module first of all
