"""A run folder whose lock another holder keeps is refused with its own exception,
:class:`~art_hydra.errors.RunFolderBusy`, before anything is trained or written; it stays a
``ResumeError`` (what this case raised before) so earlier ``except`` clauses still catch
it. The CLI's side (exit status 1, the message, no traceback) is
tests/reliability/test_one_run_per_folder.py."""

from __future__ import annotations

from pathlib import Path

import pytest

from art_hydra import compose
from art_hydra.errors import ResumeError, RunFolderBusy
from art_hydra.run import run_validated
from art_hydra.runs.run_folder import RunLock

pytestmark = pytest.mark.model  # moved from tests/engine, whose tier was model


def test_a_busy_folder_raises_run_folder_busy(tmp_path: Path) -> None:
    holder = RunLock(tmp_path)
    holder.acquire()  # a lock of its own open file: the run's flock cannot take it
    try:
        with pytest.raises(RunFolderBusy, match="is in use by process") as raised:
            run_validated(compose(["logging.progress_bar=off"]), tmp_path)
    finally:
        holder.release()
    assert isinstance(raised.value, ResumeError)
    assert "one run per folder" in str(raised.value)
    assert sorted(p.name for p in tmp_path.iterdir()) == ["run.lock"]  # nothing else written
