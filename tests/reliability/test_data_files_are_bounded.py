"""Data and model files are read within bounds, and never reach the network (issue 32).

A dataset folder, its card and a model folder are data from elsewhere: a card's remote
``data_files`` make no request (the pre-flight never contacts a host; only
``task.allow_remote_data=true`` typed on the command line lets the run fetch them), a
card's aliases cannot expand without bound, a parquet file is measured by its footer
before pyarrow decodes it and every row by the JSONL line bound, a chat template renders
under a time and size budget, and a safetensors header nested 100,000 deep is refused
naming the file. Each hostile file is built here, in ``tmp_path``; each message names
the file or key that hit the bound.
"""

from __future__ import annotations

import json
import re
import socket
import struct
import threading
import time
from collections.abc import Iterator
from pathlib import Path

import pytest
from conftest import output_of, run_cli, write_model_files

from art_hydra import compose
from art_hydra.folder_tokenizer import FolderTokenizer, TemplateOverrun
from art_hydra.preflight import lengths
from art_hydra.tasks import dataset

pytestmark = pytest.mark.fast

#: A refusal comes in seconds; a render or a decode without bound would hit this instead.
PROMPT_S = 90
MODEL_CONFIG = {
    "model_type": "llama",
    "vocab_size": 103,
    "hidden_size": 8,
    "max_position_embeddings": 512,
    "num_hidden_layers": 1,
    "num_attention_heads": 1,
    "intermediate_size": 8,
}


class _Listener:
    """A TCP port on 127.0.0.1 that counts the connections made to it."""

    def __init__(self) -> None:
        self.sock = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
        self.sock.bind(("127.0.0.1", 0))
        self.sock.listen(16)
        self.sock.settimeout(0.2)
        self.port = self.sock.getsockname()[1]
        self.connections = 0
        self.stop = threading.Event()
        self.thread = threading.Thread(target=self._accept, daemon=True)
        self.thread.start()

    def _accept(self) -> None:
        while not self.stop.is_set():
            try:
                conn, _ = self.sock.accept()
            except OSError:
                continue
            self.connections += 1
            conn.close()

    def close(self) -> None:
        self.stop.set()
        self.thread.join(2)
        self.sock.close()


@pytest.fixture
def listener() -> Iterator[_Listener]:
    found = _Listener()
    yield found
    found.close()


def _online(listener: _Listener) -> dict[str, str]:
    """An environment where the hub is reachable (at the listener): any request the
    pre-flight made would be counted there."""
    return {
        "HF_ENDPOINT": f"http://127.0.0.1:{listener.port}",
        "HF_HUB_OFFLINE": "0",
        "HF_DATASETS_OFFLINE": "0",
        "NO_PROXY": "*",
    }


def _remote_card(folder: Path, port: int) -> Path:
    folder.mkdir()
    (folder / "local.jsonl").write_text(json.dumps({"prompt": "ab=", "answer": "ba"}) + "\n")
    (folder / "README.md").write_text(
        "---\nconfigs:\n- config_name: default\n  data_files:\n"
        "  - split: train\n    path:\n"
        "    - hf://datasets/someone/data/train.parquet\n"
        f"    - http://127.0.0.1:{port}/train.jsonl\n"
        f"    - zip://train.jsonl::http://127.0.0.1:{port}/train.zip\n"
        "---\n# a card\n"
    )
    return folder


# ---- the network ---------------------------------------------------------------------------


def test_a_card_naming_remote_files_is_refused_without_contacting_a_host(
    tmp_path: Path, listener: _Listener
) -> None:
    card = _remote_card(tmp_path / "card", listener.port)
    proc = run_cli(
        "task=dataset",
        f"task.path={card}",
        "dry_run=true",
        cwd=tmp_path,
        env=_online(listener),
        timeout=PROMPT_S,
    )
    out = output_of(proc)
    assert proc.returncode == 1, out
    assert "has a dataset card (README.md) whose data_files name remote files" in out
    assert "hf://datasets/someone/data/train.parquet" in out
    assert "task.allow_remote_data=true on the command line" in out
    assert "Traceback" not in out
    assert listener.connections == 0


def test_a_remote_task_path_is_refused_without_contacting_a_host(
    tmp_path: Path, listener: _Listener
) -> None:
    url = f"http://127.0.0.1:{listener.port}/data.jsonl"
    proc = run_cli(
        "task=dataset", f"task.path={url}", "dry_run=true", cwd=tmp_path, env=_online(listener)
    )
    out = output_of(proc)
    assert proc.returncode == 1, out
    assert "is a remote location" in out and "never contacts a host" in out
    assert listener.connections == 0


def test_allowed_on_the_command_line_the_pre_flight_says_what_the_run_will_fetch(
    tmp_path: Path, listener: _Listener
) -> None:
    card = _remote_card(tmp_path / "card", listener.port)
    proc = run_cli(
        "task=dataset",
        f"task.path={card}",
        "task.allow_remote_data=true",
        "dry_run=true",
        cwd=tmp_path,
        env=_online(listener),
        timeout=PROMPT_S,
    )
    out = output_of(proc)
    assert proc.returncode == 0, out
    assert "which the run will fetch when it starts" in out
    assert f"http://127.0.0.1:{listener.port}/train.jsonl" in out
    assert listener.connections == 0


def test_a_config_file_cannot_allow_remote_data(tmp_path: Path, listener: _Listener) -> None:
    card = _remote_card(tmp_path / "card", listener.port)
    shared = tmp_path / "shared"
    (shared / "experiment").mkdir(parents=True)
    (shared / "experiment" / "remote.yaml").write_text(
        "# @package _global_\ntask:\n  allow_remote_data: true\n"
    )
    proc = run_cli(
        "--config-dir",
        str(shared),
        "experiment=remote",
        "task=dataset",
        f"task.path={card}",
        "dry_run=true",
        cwd=tmp_path,
        env=_online(listener),
        timeout=PROMPT_S,
    )
    out = output_of(proc)
    assert proc.returncode == 1, out
    assert "task.allow_remote_data = True" in out and "is set by a config file" in out
    assert listener.connections == 0


@pytest.mark.parametrize(
    "pattern",
    [
        "hf://datasets/o/n/train.parquet",
        "https://example.com/train.jsonl",
        "s3://bucket/train.parquet",
        "gs://bucket/train.parquet",
        "zip://train.jsonl::data.zip",
        "data:application/json,{}",
        "ftp://example.com/x.csv",
    ],
)
def test_every_url_and_fsspec_chain_counts_as_remote(pattern: str) -> None:
    assert dataset.is_remote(pattern)
    assert not dataset.is_remote("data/train-00000.parquet")


def test_the_runs_fetch_names_a_failure_in_one_error(tmp_path: Path, listener: _Listener) -> None:
    """Allowed, only the run fetches; a fetch that fails (here: a port nothing serves
    HTTP on, or an environment without fsspec's HTTP support) is one SourceError naming
    it, not a traceback. Reading the rows before the fetch contacts nothing."""
    folder = tmp_path / "card"
    folder.mkdir()
    (folder / "README.md").write_text(
        "---\nconfigs:\n- config_name: default\n  data_files:\n  - split: train\n"
        f"    path: http://127.0.0.1:{listener.port}/train.jsonl\n---\n"
    )
    source = dataset.resolve_source(str(folder), allow_remote=True)
    assert source.remote and source.files is None
    ((_, why),) = list(dataset.iter_rows(source, "train", 80_000, "x"))
    assert str(why).startswith("names remote data files, fetched only when the run starts")
    assert listener.connections == 0
    listener.close()  # the port now refuses: the fetch fails
    with pytest.raises(dataset.SourceError, match="could not be fetched"):
        dataset.fetch_remote(source)


# ---- the card --------------------------------------------------------------------------------


def test_a_card_whose_aliases_expand_past_the_bound_is_refused_naming_it(tmp_path: Path) -> None:
    """Nine levels of ten aliases: a 500-byte card that ``yaml.safe_load`` expands to a
    billion values."""
    folder = tmp_path / "bomb"
    folder.mkdir()
    lines = ["---", "a0: &a0 [x, x, x, x, x, x, x, x, x, x]"]
    lines += [f"a{i}: &a{i} [" + ", ".join([f"*a{i - 1}"] * 10) + "]" for i in range(1, 10)]
    (folder / "README.md").write_text(
        "\n".join([*lines, "configs: [{data_files: x.jsonl}]", "---"])
    )
    (folder / "x.jsonl").write_text(json.dumps({"prompt": "ab=", "answer": "ba"}) + "\n")
    proc = run_cli(
        "task=dataset", f"task.path={folder}", "dry_run=true", cwd=tmp_path, timeout=PROMPT_S
    )
    out = output_of(proc)
    assert proc.returncode == 1, out
    assert f"{folder}/README.md" in out and "expands to more than 200,000 values" in out


# ---- parquet, Arrow, CSV, JSON ----------------------------------------------------------------


def test_a_huge_parquet_row_is_refused_with_its_row_and_no_budget_fix(tmp_path: Path) -> None:
    """A 2 MB prompt in a file of a few hundred bytes: refused by the row bound (the JSONL
    line bound), and the fix shortens the data: never rl.max_prompt_length=<millions>."""
    import pyarrow as pa
    import pyarrow.parquet as pq

    path = tmp_path / "rows.parquet"
    pq.write_table(
        pa.table({"prompt": ["ab=", "x" * (2 << 20)], "answer": ["ba", "y"]}),
        path,
        compression="zstd",
    )
    assert path.stat().st_size < 20_000
    proc = run_cli("task=dataset", f"task.path={path}", "dry_run=true", cwd=tmp_path)
    out = output_of(proc)
    assert proc.returncode == 1, out
    assert "rows.parquet:row 1: the row has 2,097,1" in out
    assert "rl.max_prompt_length=256" in out and "shorten or drop it" in out
    assert not re.search(r"fix: .*rl\.max_prompt_length=\d", out), out


def test_a_parquet_row_group_past_the_bound_is_refused_from_its_footer_before_decoding(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The footer says how large the row group decompresses to: refused on that, before
    pyarrow decodes a page (the bound is lowered here so the file stays small to build)."""
    import pyarrow as pa
    import pyarrow.parquet as pq

    path = tmp_path / "bomb.parquet"
    pq.write_table(pa.table({"prompt": ["x" * (4 << 20)]}), path, compression="zstd")
    assert path.stat().st_size < 20_000
    monkeypatch.setattr(dataset, "MAX_ROW_GROUP_BYTES", 1 << 20)

    def decode(*args: object, **kwargs: object) -> None:
        raise AssertionError("the parquet file was decoded")

    monkeypatch.setattr(pq.ParquetFile, "iter_batches", decode)
    source = dataset.resolve_source(str(path))
    ((where, why),) = list(dataset.iter_rows(source, "train", 80_000, "rl.max_prompt_length=256"))
    assert where == str(path)
    assert "has a row group (#0) of 4,194,3" in why and "bytes once decompressed" in why
    assert f"more than the {1 << 20:,} bytes" in why


def test_a_budget_fix_never_offers_more_than_a_config_can_take() -> None:
    cfg = compose()
    remedy = lengths._budget_remedy(cfg, "rl.max_prompt_length", 400_000_001)
    assert remedy.sets == () and "shorten or drop the longest rows" in remedy.render()
    fine = lengths._budget_remedy(cfg, "rl.max_prompt_length", 300)
    assert dict(fine.sets)["rl.max_prompt_length"] == 300


def test_compressed_or_dictionary_arrow_files_are_refused_before_decoding(tmp_path: Path) -> None:
    import pyarrow as pa

    table = pa.table({"prompt": ["x" * 1000] * 100, "answer": ["y"] * 100})
    packed = tmp_path / "packed.arrow"
    with pa.OSFile(str(packed), "wb") as sink:
        options = pa.ipc.IpcWriteOptions(compression="zstd")
        with pa.ipc.new_file(sink, table.schema, options=options) as writer:
            writer.write_table(table)
    coded = tmp_path / "coded.arrow"
    encoded = table.set_column(0, "prompt", table["prompt"].dictionary_encode())
    with pa.OSFile(str(coded), "wb") as sink, pa.ipc.new_stream(sink, encoded.schema) as writer:
        writer.write_table(encoded)
    rows = {
        name: list(
            dataset.iter_rows(dataset.resolve_source(str(tmp_path / name)), "train", 80_000, "x")
        )
        for name in ("packed.arrow", "coded.arrow")
    }
    assert "holds compressed record batches" in rows["packed.arrow"][0][1]
    assert "of the Arrow type dictionary" in rows["coded.arrow"][0][1]


def test_csv_and_json_rows_past_the_bound_are_refused_with_where_they_are(tmp_path: Path) -> None:
    big = "x" * 200_000
    (tmp_path / "rows.csv").write_text(f"prompt,answer\nab=,ba\n{big},y\ncd=,dc\n")
    (tmp_path / "rows.json").write_text(
        json.dumps([{"prompt": "ab=", "answer": "ba"}, {"prompt": big, "answer": "y"}])
    )
    for name, where in (("rows.csv", "rows.csv:3"), ("rows.json", "rows.json:row 1")):
        source = dataset.resolve_source(str(tmp_path / name))
        found = dict(dataset.iter_rows(source, "train", 80_000, "rl.max_prompt_length=256"))
        assert "the row has" in str(found[str(tmp_path / where)])
        assert "(at most 80,000 bytes per row)" in str(found[str(tmp_path / where)])
        assert sum(isinstance(v, dict) for v in found.values()) == (2 if name == "rows.csv" else 1)


# ---- the model folder -------------------------------------------------------------------------


def _model_run(folder: Path, tmp_path: Path) -> tuple[str, int, float]:
    data = tmp_path / "data.jsonl"
    data.write_text(
        json.dumps({"prompt": "ab=", "answer": "ba"})
        + "\n"
        + json.dumps({"prompt": "cd=", "answer": "dc"})
        + "\n"
    )
    start = time.monotonic()
    proc = run_cli(
        "model=pretrained",
        f"model.name={folder}",
        "model.max_seq_length=512",
        "task=jsonl",
        f"task.path={data}",
        "dry_run=true",
        cwd=tmp_path,
        timeout=PROMPT_S,
    )
    return output_of(proc), proc.returncode, time.monotonic() - start


def test_a_chat_template_with_nested_loops_is_stopped_and_named(tmp_path: Path) -> None:
    folder = write_model_files(tmp_path / "model", MODEL_CONFIG)
    (folder / "chat_template.jinja").write_text(
        "{% for i in range(100000) %}{% for j in range(100000) %}{% endfor %}{% endfor %}"
        "{{ messages[0]['content'] }}"
    )
    out, code, took = _model_run(folder, tmp_path)
    assert code == 1, out
    assert f"{folder}/chat_template.jinja did not finish within 2 seconds" in out
    assert "the template itself is the cause" in out and "model.name" in out
    assert "same command again" not in out and "Traceback" not in out
    assert took < 60


@pytest.mark.parametrize(
    "template",
    [
        "{{ 'x' * 1000000000 }}",
        "{{ 'x'.center(1000000000) }}",
        "{{ 'x'|indent(1000000000) }}",
        "{% set s = 'x' * 1000000 %}{{ s|replace('x', s) }}",
        "{% set s = 'x' * 10000000 %}{{ ([s] * 1000)|join }}",
        "{% set ns = namespace(s='xxxxxxxx') %}{% for i in range(60) %}"
        "{% set ns.s = ns.s ~ ns.s %}{% endfor %}{{ ns.s }}",
        "{{ '%1000000000s' % 'x' }}",
        "{{ '{:>1000000000}'.format('x') }}",
        "{{ 10 ** 100000000 }}",
    ],
)
def test_a_chat_template_that_builds_huge_text_is_stopped(template: str) -> None:
    tokenizer = FolderTokenizer(None, {}, {}, template, (), "chat_template.jinja")
    start = time.monotonic()
    with pytest.raises(TemplateOverrun, match="the template itself is the cause"):
        tokenizer.render([("user", "hi")])
    assert time.monotonic() - start < 10


def test_a_safetensors_header_nested_100k_deep_is_refused_naming_the_file(tmp_path: Path) -> None:
    folder = write_model_files(tmp_path / "model", MODEL_CONFIG)
    header = b'{"a": ' + b"[" * 100_000 + b"]" * 100_000 + b"}"
    (folder / "model.safetensors").write_bytes(struct.pack("<Q", len(header)) + header)
    out, code, _ = _model_run(folder, tmp_path)
    assert code == 1, out
    assert "model.safetensors has a header that cannot be read within bounds" in out
    assert "nested deeper than 64 levels" in out
    assert "RecursionError" not in out and "Traceback" not in out


def test_a_tokenizer_json_past_its_bound_is_refused_naming_it(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    from art_hydra import folder_tokenizer
    from art_hydra.model_files import FolderError

    folder = write_model_files(tmp_path / "model", MODEL_CONFIG)
    monkeypatch.setattr(folder_tokenizer, "TOKENIZER_MAX_BYTES", 1000)
    with pytest.raises(FolderError, match=r"tokenizer\.json is [\d,]+ bytes, more than the 1,000"):
        folder_tokenizer.load(folder)
