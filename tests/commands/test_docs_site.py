"""The documentation site builds with ``mkdocs build --strict``, as ``make test`` builds
it: a page missing from the nav, a broken link or a broken anchor fails. The README, the
front door, links to every page, and its links resolve on GitHub as on the site.

mkdocs and the Material theme come with the ``[dev]`` extra (through ``[docs]``), so a
missing one fails here rather than being skipped.
"""

from __future__ import annotations

import importlib.util
import os
import re
import shutil
import subprocess
import sys
from pathlib import Path

import pytest
import yaml

ROOT = Path(__file__).resolve().parents[2]
README = ROOT / "README.md"
DOCS = ROOT / "docs"

#: A relative Markdown link: ``[text](target)`` whose target has no scheme.
_LINK = re.compile(r"\]\((?!https?://|mailto:)([^)\s]+)\)")


def _build(config: Path, site: Path) -> subprocess.CompletedProcess[str]:
    for module in ("mkdocs", "material"):
        assert importlib.util.find_spec(module) is not None, (
            f"{module} is not installed: it comes with the [dev] extra "
            "(pip install -e '.[dev]'), and make test builds the site with it"
        )
    env = {**os.environ, "NO_MKDOCS_2_WARNING": "1"}  # Material's notice, not a finding
    command = ["build", "--strict", "-f", str(config), "--site-dir", str(site)]
    return subprocess.run(
        [sys.executable, "-m", "mkdocs", *command],
        capture_output=True,
        text=True,
        env=env,
        timeout=300,
    )


@pytest.fixture(scope="module")
def site(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """The site, built once from the repository's own mkdocs.yml and docs/."""
    folder = tmp_path_factory.mktemp("site")
    proc = _build(ROOT / "mkdocs.yml", folder)
    out = proc.stdout + proc.stderr
    assert proc.returncode == 0, out
    assert "WARNING" not in out, out
    return folder


def test_the_site_builds_strict_without_a_warning(site: Path) -> None:
    pages = sorted(p.relative_to(DOCS).with_suffix("") for p in DOCS.rglob("*.md"))
    for page in pages:
        built = site / "index.html" if page.name == "index" else site / page / "index.html"
        assert built.is_file(), page


def test_the_build_treats_every_broken_reference_as_a_failure() -> None:
    """The validation settings make each kind of broken reference a warning, which
    --strict turns into a failed build (mkdocs' defaults let most of them pass)."""
    config = yaml.safe_load((ROOT / "mkdocs.yml").read_text())
    assert config["docs_dir"] == "docs" and config["theme"]["name"] == "material"
    assert config["validation"] == {
        "nav": {"omitted_files": "warn", "not_found": "warn", "absolute_links": "warn"},
        "links": {
            "not_found": "warn",
            "absolute_links": "warn",
            "unrecognized_links": "warn",
            "anchors": "warn",
        },
    }
    # make test builds it strictly; --quiet would hide the warnings --strict counts.
    make = (ROOT / "Makefile").read_text()
    (line,) = [x for x in make.splitlines() if "mkdocs build" in x]
    assert "--strict" in line and "--quiet" not in line and " -q" not in line


@pytest.mark.parametrize(
    "breakage",
    [
        ("extending.md", "\nSee [the missing page](no-such-page.md).\n"),
        ("extending.md", "\nSee [a missing anchor](sweeps.md#no-such-section).\n"),
        ("a-page-not-in-the-nav.md", "# Orphan\n"),
    ],
    ids=["link", "anchor", "nav"],
)
def test_a_broken_reference_fails_the_build(tmp_path: Path, breakage: tuple[str, str]) -> None:
    shutil.copytree(DOCS, tmp_path / "docs")
    shutil.copy(ROOT / "mkdocs.yml", tmp_path / "mkdocs.yml")
    name, text = breakage
    with (tmp_path / "docs" / name).open("a") as page:
        page.write(text)
    proc = _build(tmp_path / "mkdocs.yml", tmp_path / "site")
    assert proc.returncode != 0, proc.stdout + proc.stderr
    assert "Aborted with" in proc.stdout + proc.stderr


def _readme_links() -> list[str]:
    return _LINK.findall(README.read_text(encoding="utf-8"))


def test_the_readme_links_to_every_page_and_each_link_resolves(site: Path) -> None:
    links = _readme_links()
    linked = {link.partition("#")[0] for link in links}
    pages = {f"docs/{p.relative_to(DOCS).as_posix()}" for p in DOCS.rglob("*.md")}
    assert pages <= linked, f"pages the README does not link to: {sorted(pages - linked)}"
    readme_anchors = _anchors(README.read_text(encoding="utf-8"))
    for link in links:
        path, _, anchor = link.partition("#")
        if not path:
            assert anchor in readme_anchors, link
            continue
        assert (ROOT / path).exists(), link
        if anchor:
            page = Path(path).relative_to("docs").with_suffix("")
            html = site / ("" if page.name == "index" else page) / "index.html"
            assert f'id="{anchor}"' in html.read_text(encoding="utf-8"), link


def _anchors(markdown: str) -> set[str]:
    """The anchors GitHub gives a Markdown file's headings (outside code blocks)."""
    found, fence = set(), False
    for line in markdown.splitlines():
        if line.startswith("```"):
            fence = not fence
        elif not fence and line.startswith("#"):
            title = line.lstrip("#").strip().lower()
            found.add(re.sub(r"[^\w\- ]", "", title).replace(" ", "-"))
    return found


def _flow(markdown: str) -> str:
    start = markdown.index("```\nargv ")
    return markdown[start : markdown.index("```\n", start + 4)]


def test_the_readme_and_the_code_map_show_the_same_flow() -> None:
    readme = README.read_text(encoding="utf-8")
    code_map = (DOCS / "code-map.md").read_text(encoding="utf-8")
    assert _flow(readme) == _flow(code_map)
    for path in re.findall(r"art_hydra/[\w/]+(?:\.py|/)", _flow(readme)):
        assert (ROOT / path).exists(), f"the flow map names {path}, which does not exist"


def test_the_readme_is_a_front_door() -> None:
    """At most about 400 lines; the founding deadlock is cited as ART issue #1121."""
    readme = README.read_text(encoding="utf-8")
    assert len(readme.splitlines()) <= 400
    assert "#1121" in readme
    for page in [README, *DOCS.rglob("*.md")]:
        assert "#459" not in page.read_text(encoding="utf-8"), page


def test_the_code_map_names_every_module() -> None:
    """The code map keeps up with the package: every module is named on it (by its file
    name, under its folder), and every path it or the README names exists."""
    code_map = (DOCS / "code-map.md").read_text(encoding="utf-8")
    package = ROOT / "art_hydra"
    modules = [p for p in package.rglob("*.py") if p.name != "__init__.py"]
    missing = [
        p.relative_to(ROOT).as_posix() for p in modules if not re.search(rf"\b{p.name}\b", code_map)
    ]
    assert not missing, f"docs/code-map.md does not name: {missing}"
    folders = {p.parent.relative_to(package).as_posix() for p in modules} - {"."}
    for folder in folders:
        assert f"{folder.rpartition('/')[2]}/" in code_map, f"docs/code-map.md lacks {folder}/"
    for text in (code_map, README.read_text(encoding="utf-8")):
        for path in re.findall(r"\bart_hydra/[\w/]+\.(?:py|json)\b", text):
            assert (ROOT / path).exists(), f"{path} is named but does not exist"
