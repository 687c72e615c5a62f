"""A per-worker CLI "zygote": one fresh interpreter that imports the ``art-hydra``
console script's modules once, then forks one child per CLI call.

A test that runs the CLI as a subprocess pays an interpreter start and the imports each
time (about half a second); a forked child starts from a copy of that interpreter, so
only the command's own work remains. What the child proves is what a subprocess proves:
its own process (exit status, ``sys.exit``, ``atexit``, signal handlers, global Hydra
state), its own working folder, environment, argv and file descriptors 1 and 2. The
zygote is started as a fresh ``python`` (never forked from pytest): no pytest state,
threads, logging handlers, warning filters or test imports reach the child, and the
zygote itself runs no thread, so forking it is safe.

What a fork cannot show stays a subprocess (``run_cli(fresh=True)`` in
tests/conftest.py): interpreter start (``PYTHON*``/locale variables), which modules a
command imports, ``python -m``, signals sent from outside.

Protocol (one JSON line each way, on the zygote's stdin/stdout): the parent sends
``{"argv", "cwd", "env", "out", "err"}``; the zygote answers ``{"pid"}`` when the child
started and ``{"rc"}`` when it ended (``rc`` as :attr:`subprocess.Popen.returncode`).
"""

from __future__ import annotations

import contextlib
import json
import os
import sys
from typing import Any

#: Environment variables an interpreter reads when it starts, or that the zygote's
#: imports may read when imported (torch, transformers, the Hugging Face hub, thread
#: pools): a command whose environment changes one of them needs a fresh process.
START_VARIABLES = (
    "PYTHON",
    "LC_",
    "LANG",
    "HF_",
    "HUGGINGFACE",
    "TRANSFORMERS",
    "TORCH",
    "PYTORCH",
    "CUDA",
    "OMP_",
    "MKL_",
    "TOKENIZERS",
    "XDG_",
    "HOME",
)

#: What every command's check imports after the console script's own imports, imported
#: once in the zygote. Only art_hydra's own modules: the dry run's account of imported
#: code reads ``sys.modules`` (torch, preloaded, would add ``torch.ops``, whose file is
#: the relative ``_ops.py``), and lazy imports stay the command's. Best effort: a module
#: that fails to import here is imported (and fails) in the child, where the test sees it.
PRELOADED = ("art_hydra.preflight",)


def starts_differently(env: dict[str, str], base: dict[str, str]) -> bool:
    """Whether a process started with ``env`` would start differently from the zygote
    (started with ``base``): a forked child cannot take such a change back to start."""
    keys = {k for k in (*env, *base) if k.startswith(START_VARIABLES)}
    return any(env.get(k) != base.get(k) for k in keys)


def _exit_status(error: SystemExit) -> int:
    """The status an interpreter exits with for ``sys.exit(code)``."""
    code = error.code
    if code is None:
        return 0
    if isinstance(code, int):
        return code & 0xFF
    sys.stderr.write(f"{code}\n")
    return 1


def _run_console_script(script: str) -> int:
    """What the console script does, ended as an interpreter ends: non-daemon threads
    joined, ``atexit`` handlers run, standard streams flushed."""
    import threading

    from art_hydra.commands.cli import main

    sys.argv[0] = script
    _become_the_script(script)
    try:
        main()
        status = 0
    except SystemExit as error:
        status = _exit_status(error)
    except BaseException:  # an uncaught error: the traceback, status 1
        sys.excepthook(*sys.exc_info())
        status = 1
    try:
        threading._shutdown()  # type: ignore[attr-defined]
    finally:
        import atexit

        atexit._run_exitfuncs()
    return status


#: The zygote's own standard streams, replaced in a child: kept referenced, since
#: collecting one would close the descriptor the child now writes to.
_REPLACED: list[Any] = []


def _become_the_script(script: str) -> None:
    """``__main__`` is the console script, as in its own process (this module is the
    zygote's ``__main__``; a command that reads where its code came from must not see it)."""
    import types

    main = types.ModuleType("__main__")
    main.__file__ = script
    main.__builtins__ = __builtins__
    _REPLACED.append(sys.modules["__main__"])
    sys.modules["__main__"] = main


def _open_stream(fd: int, *, stderr: bool) -> Any:
    import io

    raw = io.FileIO(fd, "w", closefd=False)
    errors = "backslashreplace" if stderr else "strict"
    return io.TextIOWrapper(raw, encoding="utf-8", errors=errors, line_buffering=stderr)


def _child(request: dict[str, Any]) -> None:
    """In the forked child: become the command's process, run it, exit with its status."""
    status = 1
    try:
        os.setpgid(0, 0)  # its own group, so a timeout kills whatever it started too
        for fd, path in ((0, os.devnull), (1, request["out"]), (2, request["err"])):
            opened = os.open(path, os.O_RDONLY if fd == 0 else os.O_WRONLY | os.O_TRUNC)
            os.dup2(opened, fd)
            os.close(opened)
        _REPLACED.extend((sys.stdin, sys.stdout, sys.stderr))
        sys.stdin = sys.__stdin__ = open(0, closefd=False)  # noqa: SIM115
        sys.stdout = sys.__stdout__ = _open_stream(1, stderr=False)
        sys.stderr = sys.__stderr__ = _open_stream(2, stderr=True)
        os.chdir(request["cwd"])
        os.environ.clear()
        os.environ.update(request["env"])
        sys.argv = list(request["argv"])
        status = _run_console_script(request["argv"][0])
    finally:
        for stream in (sys.stdout, sys.stderr):
            with contextlib.suppress(Exception):  # a stream the command closed
                stream.flush()
        os._exit(status)


def _returncode(status: int) -> int:
    return -os.WTERMSIG(status) if os.WIFSIGNALED(status) else os.WEXITSTATUS(status)


def _serve(replies: Any) -> None:
    for line in sys.stdin:
        request = json.loads(line)
        pid = os.fork()
        if pid == 0:
            _child(request)
        replies.write(json.dumps({"pid": pid}) + "\n")
        replies.flush()
        _, status = os.waitpid(pid, 0)
        replies.write(json.dumps({"rc": _returncode(status)}) + "\n")
        replies.flush()


def serve(script: str) -> None:
    """The zygote's loop: import what the console script imports, say so, then fork one
    child per request until stdin closes (the pytest worker ended)."""
    # A console script's sys.path[0] is its own folder, never the working folder.
    sys.path[0] = os.path.dirname(script)
    import importlib

    import art_hydra.commands.cli  # noqa: F401  (the console script's import)

    for name in PRELOADED:
        with contextlib.suppress(BaseException):  # the child imports it again, and fails
            importlib.import_module(name)

    replies = os.fdopen(os.dup(1), "w")
    null = os.open(os.devnull, os.O_RDWR)
    os.dup2(null, 1)  # the zygote itself prints nothing its children could inherit
    os.close(null)
    replies.write(json.dumps({"ready": os.getpid()}) + "\n")
    replies.flush()
    _serve(replies)


class Zygote:
    """The pytest worker's end: start the zygote once, run commands through it."""

    def __init__(self, script: str, env: dict[str, str]) -> None:
        import subprocess

        self.script = script
        self.env = dict(env)
        self.proc = subprocess.Popen(
            [sys.executable, __file__, script],
            env=self.env,
            stdin=subprocess.PIPE,
            stdout=subprocess.PIPE,
            bufsize=0,
        )
        self._pending = b""
        if self._reply(timeout=None) is None:
            raise RuntimeError(f"the CLI zygote did not start (status {self.proc.wait()})")

    def run(
        self, args: list[str], *, cwd: str, env: dict[str, str], timeout: float, scratch: str
    ) -> Any:
        """``art-hydra ARGS`` in a forked child, as :func:`subprocess.run` with
        ``capture_output=True, text=True`` would report it."""
        import shutil
        import subprocess
        import tempfile

        argv = [self.script, *args]
        # A folder per call: a grandchild a timed-out call left running (in a session of
        # its own, beyond the kill) cannot write into the next call's output.
        call = tempfile.mkdtemp(dir=scratch)
        out, err = os.path.join(call, "stdout"), os.path.join(call, "stderr")
        for path in (out, err):
            open(path, "wb").close()
        request = {"argv": argv, "cwd": cwd, "env": env, "out": out, "err": err}
        assert self.proc.stdin
        self.proc.stdin.write(json.dumps(request).encode() + b"\n")
        pid = self._reply(timeout=None)["pid"]
        ended = self._reply(timeout=timeout)
        timed_out = ended is None
        if ended is None:
            self._kill(pid)
            ended = self._reply(timeout=None)
        rc = ended["rc"]
        stdout, stderr = _read_text(out), _read_text(err)
        if not timed_out:
            shutil.rmtree(call, ignore_errors=True)
        if timed_out:
            raise subprocess.TimeoutExpired(argv, timeout, output=stdout, stderr=stderr)
        return subprocess.CompletedProcess(argv, rc, stdout, stderr)

    def _reply(self, timeout: float | None) -> Any:
        """The zygote's next reply, or None when none came within ``timeout``."""
        import select
        import time

        assert self.proc.stdout
        fd = self.proc.stdout.fileno()
        deadline = None if timeout is None else time.monotonic() + timeout
        while b"\n" not in self._pending:
            left = None if deadline is None else max(0.0, deadline - time.monotonic())
            if not select.select([fd], [], [], left)[0]:
                return None
            chunk = os.read(fd, 65536)
            if not chunk:
                raise RuntimeError(f"the CLI zygote ended (status {self.proc.wait()})")
            self._pending += chunk
        line, self._pending = self._pending.split(b"\n", 1)
        return json.loads(line)

    @staticmethod
    def _kill(pid: int) -> None:
        import signal

        for kill in (os.killpg, os.kill):
            with contextlib.suppress(ProcessLookupError):
                kill(pid, signal.SIGKILL)

    def close(self) -> None:
        if self.proc.stdin:
            self.proc.stdin.close()
        try:
            self.proc.wait(timeout=10)
        except Exception:  # a child still running past the session: end it
            self.proc.kill()
            self.proc.wait()


def _read_text(path: str) -> str:
    """A captured stream as ``text=True`` reads it: decoded, universal newlines."""
    with open(path, encoding="utf-8", errors="replace", newline=None) as handle:
        return handle.read()


if __name__ == "__main__":
    serve(sys.argv[1])
