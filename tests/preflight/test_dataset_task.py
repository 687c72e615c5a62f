"""task=dataset: TRL-format data from real json, jsonl, csv, parquet files, folders,
save_to_disk folders and a hub cache, streamed into Examples and checked by the world
pre-flight (bad rows named ``file:line``, ``file:row N`` or ``split:row``), without torch.

The files are written with pandas, pyarrow and ``datasets`` as a user would."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path
from typing import Any

import pandas as pd
import pytest

from art_hydra import compose
from art_hydra.preflight import world_problems
from art_hydra.preflight.task import chat_template_known
from art_hydra.tasks.base import iter_examples
from art_hydra.tasks.jsonl import Scan

#: Room for the rows' prompts on the tiny model.
FIT = ["rl.max_prompt_length=32", "rl.max_completion_length=16", "sft.max_length=48"]
ROWS = [
    {"prompt": "3+4=", "completion": "7", "level": 1},
    {"prompt": "1+1=", "completion": "2", "level": 2},
]


def _cfg(path: Any, *extra: str) -> Any:
    return compose(["task=dataset", f"task.path={path}", *FIT, *extra])


def _world(path: Any, *extra: str) -> dict[str, list]:
    found: dict[str, list] = {}
    for p in world_problems(_cfg(path, *extra), None):
        found.setdefault(p.key, []).append(p)
    return found


def _examples(path: Any, *extra: str) -> list[tuple[str, Any]]:
    return list(iter_examples(_cfg(path, *extra)))


def _write(tmp_path: Path, fmt: str, rows: list[dict[str, Any]], name: str = "data") -> Path:
    frame = pd.DataFrame(rows)
    path = tmp_path / f"{name}.{fmt}"
    if fmt == "parquet":
        frame.to_parquet(path)
    elif fmt == "csv":
        frame.to_csv(path, index=False)
    elif fmt == "jsonl":
        path.write_text("".join(json.dumps(r) + "\n" for r in rows))
    elif fmt == "json":
        path.write_text(json.dumps(rows))
    return path


# ---- formats and sources --------------------------------------------------------------


@pytest.mark.parametrize(
    ("fmt", "first"),
    [
        ("parquet", "data.parquet:row 0"),
        ("csv", "data.csv:2"),
        ("jsonl", "data.jsonl:1"),
        ("json", "data.json:row 0"),
    ],
)
def test_each_file_format_gives_the_same_examples(tmp_path: Path, fmt: str, first: str) -> None:
    path = _write(tmp_path, fmt, ROWS)
    found = _examples(path)
    assert [(e.prompt, e.answer) for _, e in found] == [("3+4=", "7"), ("1+1=", "2")]
    assert found[0][0].endswith(first)
    # every column but the prompt and TRL's completion reaches the rewards (CSV cells are text)
    assert found[1][1].columns == {"level": "2" if fmt == "csv" else 2}
    assert _world(path) == {}


def test_a_folder_is_split_by_file_name_and_task_split_picks_one(tmp_path: Path) -> None:
    folder = tmp_path / "repo"
    (folder / "data").mkdir(parents=True)
    _write(folder / "data", "parquet", ROWS, "train")
    _write(folder / "data", "jsonl", [{"prompt": "9+0=", "completion": "9"}], "test")
    assert [e.prompt for _, e in _examples(folder)] == ["3+4=", "1+1="]
    ((where, example),) = _examples(folder, "task.split=test")
    assert (where, example.prompt) == ("data/test.jsonl:1", "9+0=")
    (problem,) = _world(folder, "task.split=validation")["task.path"]
    assert "has no split 'validation' (its splits: train, test)" in problem.reason
    assert problem.fix.overrides() == ["task.split=train"]


def test_a_save_to_disk_folder_names_rows_by_split(tmp_path: Path) -> None:
    from datasets import Dataset, DatasetDict

    bad = [{"prompt": "", "completion": "x"}, {"prompt": "5+5=", "completion": "10"}]
    DatasetDict({"train": Dataset.from_list(ROWS), "test": Dataset.from_list(bad)}).save_to_disk(
        tmp_path / "saved"
    )
    assert [e.answer for _, e in _examples(tmp_path / "saved")] == ["7", "2"]
    (problem,) = _world(tmp_path / "saved", "task.split=test")["task.path"]
    assert "1 row cannot be used:\ntest:0: 'prompt' is empty" in problem.reason


def test_a_file_has_only_the_train_split(tmp_path: Path) -> None:
    (problem,) = _world(_write(tmp_path, "parquet", ROWS), "task.split=test")["task.path"]
    assert "(its splits: train)" in problem.reason


# ---- hub datasets: the local cache only ----------------------------------------------------


def test_a_hub_dataset_is_read_from_the_cache_and_never_downloaded(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    from huggingface_hub import constants

    monkeypatch.setattr(constants, "HF_HUB_CACHE", str(tmp_path / "hub"))
    (problem,) = _world("acme/sums")["task.path"]
    assert "no hub dataset 'acme/sums' is in the local cache" in problem.reason
    assert "hf download acme/sums --repo-type dataset" in problem.fix.note
    # the layout `hf download` leaves: refs/main names the snapshot holding the files
    repo = tmp_path / "hub" / "datasets--acme--sums"
    commit = "0" * 40
    (repo / "refs").mkdir(parents=True)
    (repo / "refs" / "main").write_text(commit)
    snapshot = repo / "snapshots" / commit / "data"
    snapshot.mkdir(parents=True)
    _write(snapshot, "parquet", ROWS, "train-00000-of-00001")
    # a loading script in the repository is data to ignore, never code to run
    marker = tmp_path / "script-ran"
    script = f"open({str(marker)!r}, 'w').write('ran')\n"
    (snapshot.parent / "sums.py").write_text(script)
    found = _examples("acme/sums")
    assert next((w, e.prompt) for w, e in found) == (
        "data/train-00000-of-00001.parquet:row 0",
        "3+4=",
    )
    assert _world("acme/sums") == {}
    assert not marker.exists()


@pytest.mark.parametrize(
    ("path", "words"),
    [
        ("missing.parquet", "no such file or folder"),
        ("notes.txt", "a format task=dataset does not"),
    ],
)
def test_paths_that_hold_no_dataset(tmp_path: Path, path: str, words: str) -> None:
    (tmp_path / "notes.txt").write_text("hello")
    (problem,) = _world(tmp_path / path)["task.path"]
    assert words in problem.reason


def test_a_folder_without_data_files(tmp_path: Path) -> None:
    (tmp_path / "README.md").write_text("# nothing")
    (problem,) = _world(tmp_path)["task.path"]
    assert "a folder with no data files" in problem.reason


# ---- TRL formats ---------------------------------------------------------------------------


def test_columns_are_mapped_and_the_fix_names_the_likely_column(tmp_path: Path) -> None:
    rows = [{"question": "3+4=", "solution": "7", "source": "gsm"}]
    path = _write(tmp_path, "parquet", rows)
    (problem,) = _world(path)["task.path"]
    assert "its columns are question, solution, source" in problem.reason
    # the missing prompt and the missing answer in one report, not one after the other
    assert "nor an answer column ('completion' or 'answer')" in problem.reason
    mapped = ["task.columns.prompt=question", "task.columns.answer=solution"]
    assert problem.fix.overrides() == mapped
    assert _world(path, *mapped) == {}
    ((_, example),) = _examples(path, *mapped)
    # the mapped answer column stays a column (a TRL reward takes it as `solution=`), and
    # the `answer` column every reward sees is the mapped one
    assert (example.answer, dict(example.columns)) == (
        "7",
        {"solution": "7", "source": "gsm", "answer": "7"},
    )


def test_a_mapped_column_that_is_absent_names_the_columns_present(tmp_path: Path) -> None:
    path = _write(tmp_path, "jsonl", ROWS)
    (problem,) = _world(path, "task.columns.answer=solution")["task.path"]
    assert "has no 'solution' column (task.columns.answer); its columns are prompt," in (
        problem.reason
    )


def test_conversational_prompts_keep_their_messages(tmp_path: Path) -> None:
    rows = [
        {
            "prompt": [
                {"role": "system", "content": "Add."},
                {"role": "user", "content": "3+4="},
            ],
            "completion": [{"role": "assistant", "content": "7"}],
            "id": 5,
        }
    ]
    ((_, example),) = _examples(_write(tmp_path, "parquet", rows))
    assert example.messages == (("system", "Add."), ("user", "3+4="))
    assert (example.answer, dict(example.columns)) == ("7", {"id": 5})


def test_messages_rows_keep_every_assistant_turn(tmp_path: Path) -> None:
    """A conversation with several assistant turns: its prompt and answer are cut before
    the last turn (what RL and evaluation read), and the whole conversation is kept, so
    SFT trains every assistant turn (no warning that earlier ones are lost)."""
    chat = [
        {"role": "user", "content": "2+2="},
        {"role": "assistant", "content": "4"},
        {"role": "user", "content": "and 3+4="},
        {"role": "assistant", "content": "7"},
    ]
    path = _write(tmp_path, "jsonl", [{"messages": chat}])
    ((_, example),) = _examples(path, "algorithm=sft")
    assert example.answer == "7"
    assert example.messages == (("user", "2+2="), ("assistant", "4"), ("user", "and 3+4="))
    assert example.conversation_messages() == chat
    unfinished = _write(tmp_path, "jsonl", [{"messages": chat[:3]}], "open")
    (problem,) = _world(unfinished, "algorithm=sft")["task.path"]
    assert "ends with a 'user' turn; SFT trains on the last assistant turn" in problem.reason
    assert not [p for p in _world(path, "algorithm=sft").get("task.path", []) if "turn" in p.reason]


def test_a_conversation_needs_a_chat_template_which_the_tiny_model_lacks(tmp_path: Path) -> None:
    rows = [{"prompt": [{"role": "user", "content": "3+4="}], "completion": "7"}]
    (problem,) = _world(_write(tmp_path, "parquet", rows))["task.path"]
    assert "data.parquet:row 0 is a conversation" in problem.reason
    assert "the tiny model's character tokenizer has none" in problem.reason


def test_a_system_prompt_needs_a_chat_template_and_its_fix_works(tmp_path: Path) -> None:
    path = _write(tmp_path, "parquet", ROWS)
    (problem,) = _world(path, "task.system_prompt=Add the numbers.")["task.system_prompt"]
    assert problem.fix.overrides() == ["task.system_prompt=null"]
    assert _world(path, "task.system_prompt=Add the numbers.", *problem.fix.overrides()) == {}
    # iter_examples applies it (what the run encodes); the data pass sees the rows as they are
    ((_, first), _) = _examples(path, "task.system_prompt=Add.")
    assert first.messages == (("system", "Add."), ("user", "3+4="))


def test_a_system_prompt_goes_first_in_a_conversation_without_its_own(tmp_path: Path) -> None:
    """TRL's usual conversational prompt has no system turn: task.system_prompt leads it;
    a conversation with its own system turn keeps that one."""
    rows = [
        {"prompt": [{"role": "user", "content": "3+4="}], "completion": "7"},
        {
            "prompt": [{"role": "system", "content": "Mine."}, {"role": "user", "content": "1+1="}],
            "completion": "2",
        },
    ]
    path = _write(tmp_path, "jsonl", rows)
    ((_, bare), (_, own)) = _examples(path, "task.system_prompt=Add.")
    assert bare.messages == (("system", "Add."), ("user", "3+4="))
    assert own.messages == (("system", "Mine."), ("user", "1+1="))


def test_chat_template_is_read_from_the_tokenizer_files(tmp_path: Path) -> None:
    def model(folder: str, files: dict[str, str]) -> Any:
        (tmp_path / folder).mkdir()
        for name, text in files.items():
            (tmp_path / folder / name).write_text(text)
        return compose([f"model.name={tmp_path / folder}", "model.source=pretrained"]).model

    plain = model("plain", {"tokenizer_config.json": "{}"})
    inline = model("inline", {"tokenizer_config.json": '{"chat_template": "{{ x }}"}'})
    jinja = model("jinja", {"tokenizer_config.json": "{}", "chat_template.jinja": "{{ x }}"})
    bare = model("bare", {})
    assert [chat_template_known(m) for m in (plain, inline, jinja, bare)] == [
        False,
        True,
        True,
        None,
    ]


# ---- bad rows --------------------------------------------------------------------------------


@pytest.mark.parametrize(
    ("row", "words"),
    [
        ({"prompt": 3}, "'prompt' must be text or a list of messages, not int"),
        ({"prompt": "   "}, "'prompt' is empty"),
        ({"prompt": "a\ud800"}, "'prompt' holds \\ud800 (character 2), a lone UTF-16 surrogate"),
        ({"prompt": []}, "'prompt' is an empty list of messages"),
        ({"prompt": [{"role": "robot", "content": "hi"}]}, "'prompt'[0] has the role 'robot'"),
        ({"prompt": [{"role": "user", "content": 5}]}, "'prompt'[0]'s content must be a string"),
        ({"prompt": ["hi"]}, "'prompt'[0] must be a {role, content} object, not str"),
        (
            {"prompt": [{"role": "user", "content": [{"type": "image"}]}]},
            "'prompt'[0] has its content as a list of parts (TRL's multimodal format",
        ),
        ({"prompt": "a=", "completion": 7}, "'completion' must be text, not int"),
        ({"prompt": "a=", "completion": ""}, "has an empty 'completion', which the reward"),
        ({"messages": "hi"}, "'messages' must be a list of messages, not str"),
        ({"text": "hi"}, "has neither a 'prompt' column (task.columns.prompt) nor a 'messages'"),
    ],
)
def test_bad_rows_are_named_with_file_and_line(
    tmp_path: Path, row: dict[str, Any], words: str
) -> None:
    path = tmp_path / "data.jsonl"
    good = json.dumps({"prompt": "1+1=", "completion": "2"})
    path.write_text(good + "\n" + json.dumps(row) + "\n")
    (problem,) = _world(path)["task.path"]
    assert f"1 row cannot be used:\n{path}:2: " in problem.reason
    assert words in problem.reason, problem.reason


def test_bad_parquet_rows_are_listed_and_the_rest_counted(tmp_path: Path) -> None:
    rows = [{"prompt": "", "completion": "x"}] * 25 + ROWS
    (problem,) = _world(_write(tmp_path, "parquet", rows))["task.path"]
    assert problem.reason.startswith("25 rows cannot be used:\n")
    assert "data.parquet:row 9: 'prompt' is empty" in problem.reason
    assert "... and 15 more" in problem.reason


def test_sft_needs_an_answer_in_every_row(tmp_path: Path) -> None:
    path = _write(tmp_path, "parquet", [{"prompt": "a="}])
    (problem,) = _world(path, "algorithm=sft")["task.path"]
    assert "has no answer column (its columns: prompt), which SFT needs" in problem.reason


# ---- the one stream, for every source ----------------------------------------------------------


def test_iter_examples_streams_every_source(tmp_path: Path) -> None:
    generated = list(iter_examples(compose(["task.num_examples=3"])))
    assert len(generated) == 3 and generated[0][0].startswith("example #0 (")
    path = tmp_path / "data.jsonl"
    path.write_text('{"prompt": "ab=", "answer": "ba", "level": 3}\nnot json\n')
    cfg = compose(["task=jsonl", f"task.path={path}", *FIT])
    scan = Scan()
    ((where, example),) = list(iter_examples(cfg, scan))
    assert (where, dict(example.columns)) == (f"{path}:1", {"answer": "ba", "level": 3})
    assert scan.errors == [f"{path}:2: not valid JSON (Expecting value at column 1)"]


def test_reading_a_dataset_imports_no_torch(tmp_path: Path) -> None:
    path = _write(tmp_path, "parquet", ROWS)
    from datasets import Dataset

    Dataset.from_list(ROWS).save_to_disk(tmp_path / "saved")
    code = (
        "import sys\n"
        "from art_hydra import compose\n"
        "from art_hydra.preflight import world_problems\n"
        f"for path in [{str(path)!r}, {str(tmp_path / 'saved')!r}]:\n"
        f"    cfg = compose(['task=dataset', 'task.path=' + path, *{FIT!r}])\n"
        "    assert world_problems(cfg, None) == [], path\n"
        "assert 'torch' not in sys.modules\n"
    )
    proc = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True)
    assert proc.returncode == 0, proc.stderr


def _jsonl_rows(path: Path, count: int) -> None:
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(
        "".join(json.dumps({"prompt": f"q{i}", "completion": "a"}) + "\n" for i in range(count))
    )


def test_a_repository_of_several_configs_is_refused_not_merged(tmp_path: Path) -> None:
    """gsm8k's layout (main/ and socratic/, each a config with its own answers) and a card
    declaring two configs are refused; split folders and a card's one config are read as
    the hub reads them (the card's files only)."""
    from art_hydra.tasks import dataset

    gsm = tmp_path / "gsm"
    _jsonl_rows(gsm / "main" / "train-00000.jsonl", 3)
    _jsonl_rows(gsm / "socratic" / "train-00000.jsonl", 3)
    with pytest.raises(dataset.SourceError, match=r"main, socratic"):
        dataset.resolve_source(str(gsm))
    (problem,) = _world(gsm)["task.path"]
    assert "never merges" in problem.reason and problem.fix.has_placeholder
    splits = tmp_path / "splits"
    _jsonl_rows(splits / "train" / "a.jsonl", 3)
    _jsonl_rows(splits / "test" / "b.jsonl", 2)
    assert set(dataset.resolve_source(str(splits)).files) == {"train", "test"}
    card = tmp_path / "card"
    _jsonl_rows(card / "clean" / "x.jsonl", 5)
    _jsonl_rows(card / "raw" / "dump.jsonl", 50)
    header = "---\nconfigs:\n- config_name: default\n  data_files:\n  - split: train\n"
    (card / "README.md").write_text(header + "    path: clean/*.jsonl\n---\n# card\n")
    assert [Path(f).name for f in dataset.resolve_source(str(card)).files["train"]] == ["x.jsonl"]
    (card / "README.md").write_text(
        "---\nconfigs:\n- config_name: main\n  data_files: clean/*.jsonl\n"
        "- config_name: raw\n  data_files: raw/*.jsonl\n---\n"
    )
    with pytest.raises(dataset.SourceError, match=r"2 configs \(main, raw\)"):
        dataset.resolve_source(str(card))


def test_a_jsonl_file_with_a_byte_order_mark_is_read(tmp_path: Path) -> None:
    """Windows exports start UTF-8 files with a BOM: it is not part of the first line."""
    path = tmp_path / "bom.jsonl"
    path.write_bytes(b'\xef\xbb\xbf{"prompt": "3+4=", "completion": "7"}\n')
    ((_, example),) = _examples(path)
    assert example.prompt == "3+4=" and example.answer == "7"
