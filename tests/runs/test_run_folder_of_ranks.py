"""A multi-rank single run moves into rank 0's folder through Hydra's own config
(``hydra.run.dir``); the run config is resolved again only where it reads that node."""

from __future__ import annotations

from art_hydra.config.composition import compose_and_check, in_run_folder, make_loader

READS_FOLDER = "task.system_prompt=${hydra:runtime.output_dir}"


def test_a_run_that_reads_no_hydra_value_keeps_its_checked_config() -> None:
    loader = make_loader()
    checked = compose_and_check(loader, "config", [], keep_composed=True)
    moved = in_run_folder(checked, "/tmp/rank0-folder", loader, "config", [])
    assert moved is checked  # nothing in the run config depends on the folder: no recheck
    assert moved.run_dir == "/tmp/rank0-folder"
    assert moved.composed is not None and moved.composed.hydra.run.dir == "/tmp/rank0-folder"


def test_a_value_read_from_the_folder_is_resolved_in_rank_0s_folder() -> None:
    loader = make_loader()
    checked = compose_and_check(loader, "config", [READS_FOLDER], keep_composed=True)
    assert checked.ok, checked.problems
    moved = in_run_folder(checked, "/tmp/rank0-folder", loader, "config", [READS_FOLDER])
    assert moved is not checked and moved.ok
    assert moved.run_dir == "/tmp/rank0-folder"
    assert moved.resolved is not None and moved.resolved.task.system_prompt == "/tmp/rank0-folder"
