"""Paths a user names, checked before any system call can fail or block on them.

A path from a config (``task.path``, ``model.name``, ``hydra.run.dir``) reaches ``os``
calls that raise on shapes no file can have (a NUL byte, a component over 255 bytes, a
whole path over ``PATH_MAX``) and ``open`` calls that never return on files that are not
files (a FIFO with no writer, ``/dev/zero``, a terminal). :func:`path_refusal` names the
first kind before any call is made; :func:`file_refusal` the second, from ``os.stat``
alone (it never opens); :func:`open_regular` opens without blocking and checks again on
the open descriptor, so a file swapped for a FIFO after the check is refused too.
Plain ``os`` only: the pre-flight imports this.
"""

from __future__ import annotations

import hashlib
import os
import stat
from typing import BinaryIO

#: The longest file-name component Linux (and macOS) file systems accept, in bytes.
NAME_MAX = 255
#: The longest path the kernel accepts in one call, in bytes (Linux's PATH_MAX).
PATH_MAX = 4096

_KINDS = (
    (stat.S_ISDIR, "a directory"),
    (stat.S_ISFIFO, "a FIFO (named pipe)"),
    (stat.S_ISCHR, "a character device"),
    (stat.S_ISBLK, "a block device"),
    (stat.S_ISSOCK, "a socket"),
)


class RefusedFile(OSError):
    """A path that is not a regular file, or that no file can have: ``strerror`` says
    why, ``str`` names the path too."""

    def __init__(self, path: str | os.PathLike, reason: str) -> None:
        super().__init__(reason)
        self.strerror = reason
        self.filename = os.fspath(path)

    def __str__(self) -> str:
        return f"{self.filename} {self.strerror}"


def path_refusal(path: str | os.PathLike) -> str | None:
    """Why ``path`` cannot name any file (None: it can), decided without a system call."""
    text = os.fspath(path)
    if isinstance(text, str) and "\x00" in text:
        return "contains a NUL byte, which no path can hold"
    try:
        raw = os.fsencode(text)
    except UnicodeError:
        return "holds characters that cannot be encoded as a file name"
    if b"\x00" in raw:
        return "contains a NUL byte, which no path can hold"
    if len(raw) >= PATH_MAX:
        return f"is {len(raw):,} bytes long; a path may have at most {PATH_MAX - 1:,}"
    longest = max(raw.split(b"/"), key=len)
    if len(longest) > NAME_MAX:
        shown = longest[:24].decode(errors="replace")
        return (
            f"has a component of {len(longest):,} bytes ({shown}...); a file or folder name "
            f"may have at most {NAME_MAX}"
        )
    return None


def kind_of(mode: int) -> str | None:
    """What a file of ``mode`` is, when it is not a regular file (None: it is one)."""
    if stat.S_ISREG(mode):
        return None
    return next((name for test, name in _KINDS if test(mode)), "not a regular file")


def file_refusal(path: str | os.PathLike) -> str | None:
    """Why ``path`` is not a regular file that can be read (None: it is one).

    ``os.stat`` only (it follows symlinks, as ``open`` would): opening a FIFO to look
    would block until a writer comes, and opening a device may have effects."""
    refusal = path_refusal(path)
    if refusal is not None:
        return refusal
    try:
        info = os.stat(path)
    except FileNotFoundError:
        return "does not exist"
    except OSError as exc:
        return f"cannot be read ({exc.strerror or exc})"
    kind = kind_of(info.st_mode)
    return None if kind is None else f"is {kind}, not a regular file"


def sha256_of(handle: BinaryIO) -> str:
    """The SHA-256 of what is left to read in ``handle``, streamed in 1 MiB chunks (a
    data file or checkpoint is never held whole)."""
    digest = hashlib.sha256()
    while chunk := handle.read(1 << 20):
        digest.update(chunk)
    return digest.hexdigest()


def open_regular(path: str | os.PathLike) -> BinaryIO:
    """``path`` opened for binary reading, refused (:class:`RefusedFile`) unless it is a
    regular file: checked by ``stat`` before and ``fstat`` after a non-blocking open."""
    refusal = file_refusal(path)
    if refusal is not None:
        raise RefusedFile(path, refusal)
    flags = os.O_RDONLY | getattr(os, "O_NONBLOCK", 0) | getattr(os, "O_NOCTTY", 0)
    fd = os.open(path, flags | getattr(os, "O_CLOEXEC", 0))
    try:
        kind = kind_of(os.fstat(fd).st_mode)
        if kind is not None:
            raise RefusedFile(path, f"is {kind}, not a regular file")
        os.set_blocking(fd, True)
        return os.fdopen(fd, "rb")
    except BaseException:
        os.close(fd)
        raise
