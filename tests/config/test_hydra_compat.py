"""The private Hydra/OmegaConf calls art_hydra makes live in one module, written for one
release series: this test fails loudly on any other, so an upgrade is a deliberate act."""

from __future__ import annotations

import ast
import importlib
from pathlib import Path

from art_hydra.config import hydra_compat

ROOT = Path(__file__).resolve().parents[2]
COMPAT = ROOT / "art_hydra" / "config" / "hydra_compat.py"


def test_installed_hydra_and_omegaconf_are_the_series_compat_was_written_for() -> None:
    assert not hydra_compat.unsupported_versions(), (
        f"art_hydra/config/hydra_compat.py was written for {hydra_compat.WRITTEN_FOR}; "
        f"installed: {hydra_compat.installed_versions()}. Review every private call in it, "
        "then update WRITTEN_FOR and the version bounds in pyproject.toml."
    )


def test_every_private_name_compat_uses_still_exists() -> None:
    for module, names in hydra_compat.PRIVATE_NAMES.items():
        loaded = importlib.import_module(module)
        for name in names:
            assert hasattr(loaded, name), f"{module}.{name} is gone"
    from hydra._internal.config_loader_impl import ConfigLoaderImpl
    from omegaconf import DictConfig

    assert callable(ConfigLoaderImpl._apply_overrides_to_config)
    assert callable(DictConfig._get_node)


def _private_uses(path: Path) -> list[str]:
    found = []
    for node in ast.walk(ast.parse(path.read_text())):
        if isinstance(node, ast.ImportFrom) and node.module and "._internal" in f".{node.module}":
            found.append(f"from {node.module}")
        elif isinstance(node, ast.Attribute) and node.attr in {
            "_get_node",
            "_value",
            "_apply_overrides_to_config",
            "_is_missing",
            "_is_none",
            "_is_interpolation",
            "_get_parent",
            "_set_value",
            "_set_item_impl",
        }:
            found.append(node.attr)
        elif isinstance(node, ast.Subscript) and _is_text(node.slice, "_content"):
            found.append("_content")
    return found


def _is_text(node: ast.AST, text: str) -> bool:
    return isinstance(node, ast.Constant) and node.value == text


def test_no_private_hydra_call_outside_the_compat_module() -> None:
    sources = [*ROOT.glob("art_hydra/**/*.py"), *ROOT.glob("hydra_plugins/**/*.py")]
    offenders = {
        str(p.relative_to(ROOT)): uses
        for p in sources
        if p != COMPAT and (uses := _private_uses(p))
    }
    assert not offenders
    assert _private_uses(COMPAT)  # the check itself can see them


def test_a_read_trace_leaves_omegaconf_as_it_found_it() -> None:
    from omegaconf import DictConfig, ListConfig, OmegaConf
    from omegaconf.basecontainer import BaseContainer
    from omegaconf.nodes import ValueNode

    classes = (DictConfig, ListConfig, BaseContainer, ValueNode)
    before = [dict(vars(cls)) for cls in classes]
    cfg = OmegaConf.create({"a": {"x": 1}, "l": [1]})
    with hydra_compat.traced_reads() as outer:
        with hydra_compat.traced_reads() as inner:
            assert cfg.a.x == 1
        assert f"{cfg.l}" == "[1]"
    assert [dict(vars(cls)) for cls in classes] == before
    assert [k for _, k in inner] == ["a", "x"]
    assert [k for _, k in outer[:3]] == ["a", "x", "l"]
    assert {k for _, k in outer[3:]} == {hydra_compat.TRACE_WHOLE}  # format, str, repr
