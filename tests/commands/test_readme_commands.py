"""Every command the README and the documentation pages show runs as written: each
``art-hydra ...`` and ``python -m art_hydra ...`` line of their fenced code blocks (README.md
and every ``docs/**/*.md``) is dry-run here. A command shown on several pages runs once,
under the first page that shows it.

How a command is read (so the pages can change freely):

* fenced blocks only (```` ``` ```` or ``~~~``, indented or not, any language); a line
  ending in ``\\`` continues on the next; a leading ``$ `` prompt is dropped; ``#``
  comments and shell redirections (``> file``) are dropped; ``...`` stands for "your
  other overrides" and is dropped;
* a single run gets ``dry_run=true`` (validate, pre-flight, print, exit 0), a sweep
  (``-m``) gets it too (the pre-flight of every point, nothing launched); ``--help``,
  ``--cfg``, ``--info``, ``--schema`` and ``summarize`` run as they are;
* a command in a block that also shows a refusal report ("The configuration cannot
  run") is an example of a refusal: it must exit 1 with that report, never a traceback.

Names the pages use for the reader's own files are made real in the working folder
or mapped to temporary paths (:data:`PLACEHOLDERS`); a placeholder this test does not
know fails the test with its name, so a new one is added here, not skipped. Commands
that cannot run on this machine are listed in :data:`NOT_HERE` with the reason. Hub
models the shipped presets name are found in a Hugging Face cache this test builds
(tiny real-family folders under those ids, no network), so their commands run the whole
pre-flight; code blocks of any page that start with ``# file: name.py`` are the reader's
files, written (and ``make_*.py`` run) before the commands.
"""

from __future__ import annotations

import dataclasses
import os
import re
import shlex
import shutil
import subprocess
import sys
from dataclasses import dataclass
from pathlib import Path

import pytest
from conftest import ART_HYDRA

ROOT = Path(__file__).resolve().parents[2]
README = ROOT / "README.md"


def pages() -> list[Path]:
    """The README and every page of the documentation site."""
    return [README, *sorted((ROOT / "docs").rglob("*.md"))]


def _page_name(page: Path) -> str:
    return page.relative_to(ROOT).as_posix()


#: The start of a command line this test runs.
_COMMAND = re.compile(r"^(art-hydra|python3? -m art_hydra|torchrun)(\s|$)")
_FENCE = re.compile(r"^(\s*)(```|~~~)")
#: What a block shows when its command is an example of a refusal.
_REFUSAL = "The configuration cannot run"

#: Commands that cannot be dry-run on this machine, by their first words, with why.
NOT_HERE: dict[str, str] = {
    "torchrun": "starts one process per rank (needs several devices or CPU processes "
    "for each rank, and a rendezvous); each rank runs the same checks as a single run, "
    "tested in tests/distributed",
}

#: Commands that run in another environment, by a word they hold, with where they run.
ELSEWHERE: dict[str, str] = {
    "rollout.engine=vllm": "needs vLLM, which the main environment does not install (its "
    "own, .venv-vllm, runs such runs: tests/vllm_stage)",
}

#: Commands that need a change not made yet, by a word they hold: a non-strict xfail
#: until it is (then they pass, and the entry goes).
PENDING: dict[str, str] = {}

#: Relative names the pages use for the reader's files, created in the working folder.
DATA_ROWS = "".join(
    f'{{"prompt": "reverse: {w}", "answer": "{w[::-1]}"}}\n'
    for w in ("abc", "bcd", "cab", "dab", "abcd", "dcba", "bad", "cad")
)
REWARD_MODULE = (
    "from art_hydra import reward\n\n\n"
    "@reward\n"
    "def my_reward(prompt: str, completion: str, answer: str | None) -> float:\n"
    "    return float(completion.strip() == (answer or ''))\n"
)

#: Placeholders of the pages -> what this test puts there (``{tmp}``: the working
#: folder). Checked in order; every token is rewritten with each that it contains.
PLACEHOLDERS: dict[str, str] = {
    # The pages' model folder: a tiny Qwen2-family folder (Qwen's tokenizer, ChatML).
    "/path/to/Qwen2.5-0.5B-Instruct": "{model}",
    "/home/me/": "{tmp}/home/me/",  # an example user's absolute paths
    "/path/to/data.jsonl": "{tmp}/data.jsonl",
    "/path/to/": "{tmp}/",
}


@dataclass(frozen=True)
class Command:
    line: int  # the page's line the command starts on
    text: str  # the command as the page writes it, continuations joined
    refusal: bool  # its block shows a refusal report
    page: str = "README.md"  # the page, from the repository root

    @property
    def where(self) -> str:
        return f"{self.page} line {self.line}"


def readme_commands(text: str) -> list[Command]:
    """Every command line of the fenced blocks of ``text``."""
    commands: list[Command] = []
    block: list[tuple[int, str]] = []
    fence: str | None = None
    for number, line in enumerate(text.splitlines(), 1):
        opened = _FENCE.match(line)
        if fence is None:
            if opened:
                fence, block = opened.group(2), []
            continue
        if opened and opened.group(2) == fence and line.strip() == fence:
            commands += _block_commands(block)
            fence = None
            continue
        block.append((number, line))
    return commands


def _block_commands(block: list[tuple[int, str]]) -> list[Command]:
    refusal = any(_REFUSAL in line for _, line in block)
    found: list[Command] = []
    pending: tuple[int, str] | None = None
    for number, raw in block:
        line = raw.strip()
        if pending is not None:
            start, text = pending
            text = f"{text} {line.rstrip(chr(92)).strip()}"
            pending = (start, text) if line.endswith("\\") else None
            if pending is None:
                found.append(Command(start, text, refusal))
            continue
        line = line.removeprefix("$ ").strip()
        if not _COMMAND.match(line):
            continue
        if line.endswith("\\"):
            pending = (number, line.rstrip("\\").strip())
        else:
            found.append(Command(number, line, refusal))
    if pending is not None:
        found.append(Command(pending[0], pending[1], refusal))
    return found


#: A code block that starts with this line is a file of the reader's: written
#: into the working folder under that name (and run, when it is a ``make_*.py``).
_FILE_BLOCK = re.compile(r"^# file: (\S+\.py)$")


def readme_files(text: str) -> dict[str, str]:
    """The files the code blocks of a page spell out, by name."""
    files: dict[str, str] = {}
    lines, inside, block = text.splitlines(), False, []
    for line in lines:
        if _FENCE.match(line):
            if inside and block and _FILE_BLOCK.match(block[0].strip()):
                name = _FILE_BLOCK.match(block[0].strip()).group(1)  # type: ignore[union-attr]
                files[name] = "\n".join(block[1:]) + "\n"
            inside, block = not inside, []
        elif inside:
            block.append(line)
    return files


@pytest.fixture(scope="module")
def world(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """What the pages' commands need besides the reader's small files, built once: a
    model folder, a Hugging Face cache holding every hub model the shipped presets name
    (so their commands run the whole pre-flight on a real-family folder, no network), and
    the files the pages' own code blocks write (``make_data.py`` run)."""
    from model_folders import chatml_model, hub_cache_entry

    root = tmp_path_factory.mktemp("readme_world")
    model = chatml_model(root / "model")
    for name in _hub_ids():
        hub_cache_entry(model, root / "hf", name)
    files = root / "files"
    files.mkdir()
    for name, source in all_files().items():
        (files / name).write_text(source)
        if name.startswith("make_"):
            made = subprocess.run(
                [sys.executable, name], cwd=files, capture_output=True, text=True, timeout=300
            )
            assert made.returncode == 0, f"the pages' {name}: {made.stdout}{made.stderr}"
    return root


def all_commands() -> list[Command]:
    """Every command of every page, each distinct one once (where it is first shown;
    comments do not make two commands distinct)."""
    seen: set[tuple[tuple[str, ...], bool]] = set()
    commands: list[Command] = []
    for page in pages():
        for command in readme_commands(page.read_text(encoding="utf-8")):
            key = (tuple(shlex.split(command.text, comments=True)), command.refusal)
            if key in seen:
                continue
            seen.add(key)
            commands.append(dataclasses.replace(command, page=_page_name(page)))
    return commands


def all_files() -> dict[str, str]:
    """The reader's files that the pages spell out; one name is one file."""
    files: dict[str, str] = {}
    for page in pages():
        for name, source in readme_files(page.read_text(encoding="utf-8")).items():
            assert files.get(name, source) == source, f"two pages spell out {name} differently"
            files[name] = source
    return files


def _hub_ids() -> set[str]:
    """Every hub id a shipped model option or experiment names."""
    conf = Path(__file__).resolve().parents[2] / "conf"
    found = set()
    for path in [*conf.glob("model/*.yaml"), *conf.glob("experiment/*.yaml")]:
        found |= set(re.findall(r"^\s*name:\s*([\w.-]+/[\w.-]+)\s*$", path.read_text(), re.M))
    return found


def _words(command: str, tmp: Path, model: Path | None = None) -> list[str]:
    """The command's words, comments, redirections and ``...`` dropped, placeholders
    replaced."""
    words = shlex.split(command, comments=True)
    kept: list[str] = []
    skip = False
    for word in words:
        if skip:
            skip = False
            continue
        if word in (">", ">>", "2>", "<"):
            skip = True
            continue
        if word == "..." or re.match(r"^[12]?>", word):
            continue
        for name, real in PLACEHOLDERS.items():
            word = word.replace(name, real.format(tmp=tmp, model=model))
        kept.append(word)
    unknown = [w for w in kept if "/path/to" in w or re.search(r"=<[^>]*>", w)]
    assert not unknown, f"add these placeholders to PLACEHOLDERS: {unknown}"
    return kept


def _argv(words: list[str]) -> list[str]:
    """The process to start and its arguments, with the dry run added where it applies."""
    if words[0] == "art-hydra":
        cmd, args = [ART_HYDRA], words[1:]
    else:  # python -m art_hydra
        cmd, args = [sys.executable, "-m", "art_hydra"], words[3:]
    passthrough = {"--help", "-h", "--hydra-help", "--cfg", "-c", "--info", "-i", "--schema"}
    if args[:1] in (["summarize"], ["export"], ["generate"]) or passthrough & set(args):
        return cmd + args
    if not any(a.startswith("dry_run=") for a in args):
        args = [*args, "dry_run=true"]
    return cmd + args


def _setup(tmp: Path, world: Path | None = None) -> None:
    """The reader's own files the pages name, made real."""
    if world is not None:
        for made in (world / "files").iterdir():
            shutil.copy(made, tmp / made.name)
    (tmp / "data.jsonl").write_text(DATA_ROWS)
    my_conf = tmp / "my_conf" / "model"
    my_conf.mkdir(parents=True)
    tiny = (Path(__file__).resolve().parents[2] / "conf" / "model" / "tiny.yaml").read_text()
    (my_conf / "my_model.yaml").write_text(tiny)
    (tmp / "my_pkg").mkdir()
    (tmp / "my_pkg" / "__init__.py").write_text("")
    (tmp / "my_pkg" / "rewards.py").write_text(REWARD_MODULE)


def _hub_model_missing(words: list[str], world: Path) -> str | None:
    """The hub id a command's model preset downloads, when it is not in the local
    Hugging Face cache (no network on this machine), else None."""
    from hydra.types import RunMode

    from art_hydra.config.composition import make_loader

    groups = [w for w in words if re.match(r"^\+?(model|experiment)=", w)]
    if not groups:
        return None
    try:
        cfg = make_loader().load_configuration("config", groups, run_mode=RunMode.RUN)
        name, source = str(cfg.model.name), str(cfg.model.source)
    except Exception:  # model=pretrained names its folder on the command line
        return None
    if "pretrained" not in source or os.path.isdir(os.path.expanduser(name)):
        return None
    hub = world / "hf" / "hub"
    cached = hub / f"models--{name.replace('/', '--')}" / "snapshots"
    return None if any(cached.glob("*/config.json")) else name


def _resumes(words: list[str]) -> str | None:
    """The run folder a command resumes (``resume=true``), else None."""
    if "resume=true" not in words:
        return None
    folders = [w.partition("=")[2] for w in words if w.startswith("hydra.run.dir=")]
    return folders[0] if folders else None


def _tries(words: list[str]) -> tuple[str, str | None] | None:
    """The run folder an ``export``/``generate`` command reads, and the export folder it
    reads (``<run>/export``, for ``generate`` on an export), else None."""
    if len(words) < 3 or words[1] not in ("export", "generate"):
        return None
    source = words[2].rstrip("/")
    if words[1] == "generate" and source.endswith("/export"):
        return source.removesuffix("/export"), source
    return source, None


def _train_a_run(folder: str, cwd: Path) -> None:
    """The run a resume command continues: one step of the default job, checkpointed
    (only keys a resume may change differ from the default)."""
    proc = subprocess.run(
        [
            ART_HYDRA,
            "trainer.max_steps=1",
            "checkpoint.every_steps=1",
            "logging.plot=false",
            "logging.tensorboard=false",
            "logging.progress_bar=off",
            f"hydra.run.dir={folder}",
        ],
        cwd=cwd,
        env=_env(),
        capture_output=True,
        text=True,
        timeout=300,
    )
    assert proc.returncode == 0, proc.stdout + proc.stderr


def _env(world: Path | None = None) -> dict[str, str]:
    env = {k: v for k, v in os.environ.items() if k not in ("HYDRA_FULL_ERROR", "HF_HUB_CACHE")}
    env["HF_HUB_OFFLINE"] = "1"  # no network here: a download would hang, not fail
    if world is not None:
        env["HF_HOME"] = str(world / "hf")
    return env


def _params() -> list:
    params = []
    for command in all_commands():
        words = command.text.split()
        trains = "resume=true" in words or words[1:2] in (["export"], ["generate"])
        marks = [pytest.mark.slow] if trains else []
        marks += [
            pytest.mark.xfail(reason=why, strict=False)
            for word, why in PENDING.items()
            if word in command.text
        ]
        params.append(pytest.param(command, id=f"{command.page}:L{command.line}", marks=marks))
    return params


def test_the_pages_have_commands_and_every_block_is_read() -> None:
    """A guard on the parser itself: the pages show dozens of commands, including a
    continued one and one in an indented block; the README shows the refusal and its
    quick commands, and the docs pages are read too."""
    readme = readme_commands(README.read_text(encoding="utf-8"))
    assert len(readme) >= 3
    assert any(c.refusal for c in readme)
    commands = all_commands()
    assert len(commands) >= 25
    assert {c.page for c in commands} > {"README.md", "docs/configuration.md"}
    sample = readme_commands(
        "text\n```bash\n$ art-hydra a=1 \\\n  b=2  # note\nnot a command\n```\n"
        "  ```\n  python -m art_hydra c=3\n  ```\n"
    )
    assert [(c.line, c.text) for c in sample] == [
        (3, "art-hydra a=1 b=2  # note"),
        (8, "python -m art_hydra c=3"),
    ]
    assert _words(sample[0].text, Path("/t")) == ["art-hydra", "a=1", "b=2"]


@pytest.mark.parametrize("command", _params())
def test_readme_command_runs_as_written(command: Command, tmp_path: Path, world: Path) -> None:
    words = shlex.split(command.text, comments=True)
    for start, why in NOT_HERE.items():
        if command.text.startswith(start):
            pytest.skip(f"{command.where}: {why}")
    for word, why in ELSEWHERE.items():
        if word in words:
            pytest.skip(f"{command.where}: {why}")
    _setup(tmp_path, world)
    words = _words(command.text, tmp_path, world / "model")
    missing = _hub_model_missing(words, world)
    if missing is not None:
        pytest.skip(
            f"{command.where} uses the hub model {missing}, which is not in this "
            "machine's Hugging Face cache (no network here)"
        )
    resumed = _resumes(words)
    if resumed is not None:
        _train_a_run(resumed, tmp_path)
    tried = _tries(words)
    if tried is not None:  # export and generate read a trained run (and its export)
        _train_a_run(tried[0], tmp_path)
        if tried[1] is not None:
            made = subprocess.run(
                [ART_HYDRA, "export", tried[0], tried[1]], cwd=tmp_path, env=_env(), check=False
            )
            assert made.returncode == 0
    argv = _argv(words)
    proc = subprocess.run(
        argv, cwd=tmp_path, env=_env(world), capture_output=True, text=True, timeout=300
    )
    out = proc.stdout + proc.stderr
    assert "Traceback" not in out, f"{command.where}: {' '.join(argv)}\n{out}"
    if command.refusal:
        assert proc.returncode == 1 and _REFUSAL in out, f"{command.where}:\n{out}"
    else:
        assert proc.returncode == 0, f"{command.where}: {' '.join(argv)}\n{out}"


@pytest.mark.slow
def test_the_docs_trl_example_trains_and_logs_each_reward(tmp_path: Path, world: Path) -> None:
    """The end-to-end example of docs/rewards.md (a TRL-format dataset, two TRL-style
    rewards, a real-family model folder) runs for real: two steps, each reward logged on
    its own."""
    import json

    (command,) = [c for c in all_commands() if "my_rewards" in c.text]
    _setup(tmp_path, world)
    words = _words(command.text, tmp_path, world / "model")
    quick = [
        "trainer.max_steps=2",
        "trainer.per_device_train_batch_size=8",
        "rl.num_generations=4",
        "rl.max_completion_length=4",
        "logging.progress_bar=off",
        "logging.plot=false",
        "logging.tensorboard=false",
        "hydra.run.dir=run",
    ]
    proc = subprocess.run(
        [ART_HYDRA, *words[1:], *quick],
        cwd=tmp_path,
        env=_env(world),
        capture_output=True,
        text=True,
        timeout=600,
    )
    out = proc.stdout + proc.stderr
    assert proc.returncode == 0 and "Traceback" not in out, out
    lines = [json.loads(x) for x in (tmp_path / "run" / "metrics.jsonl").read_text().splitlines()]
    assert [line["step"] for line in lines][-1] == 2
    for name in ("accuracy", "format_ok"):
        assert f"reward/{name}/mean" in lines[-1], lines[-1]
