"""A JSON Schema (draft 2020-12) of the run config, for editors and other tools.

Hydra checks a config only when a run composes it; until then a user of YAML configs
types keys blind. This module walks :class:`~art_hydra.config.schema.RunConfig` (types,
enums, defaults, the help and limits declared on each field) and writes the schema
a YAML language server reads to complete and check ``conf/`` files and a user's
``--config-dir`` files as they are typed.

A config folder holds *partial* files in Hydra's syntax, and a schema sees a file's
content, never its path or its ``# @package`` comment. So the document schema accepts
a file as any one of:

* a whole-run file (``config.yaml``, experiments, ``# @package _global_`` group files):
  the run's sections, ``defaults`` and a free ``hydra`` node;
* one section, for a group file in its default package (``conf/task/jsonl.yaml`` is the
  ``task`` section; ``conf/algorithm/sft.yaml`` the ``algorithm`` section);
* Hydra's own settings, for files under ``hydra/`` (their keys are Hydra's to check).

No key is required (a file sets only some); every typed value may also be an
interpolation (``${...}``) or ``???``. Only keywords that draft 7 shares with 2020-12
are used, so language servers that implement draft 7 alone read it the same way.

What it does not express: the float32 rule of :mod:`art_hydra.config.bounds` (a nonzero
float must stay nonzero in float32) and rules between fields (validators); a bound that
applies only when another key has some value is enforced unless the same file sets that
key to another value. Composition checks all of them.

This module is on the compose/validate path: it imports no torch.
"""

from __future__ import annotations

import dataclasses
import importlib.util
import json
import sys
import types
import typing
from collections.abc import Iterable
from enum import Enum
from pathlib import Path
from typing import Any

from omegaconf import MISSING

from art_hydra.config.bounds import Bound, describe, schema_default, type_hints
from art_hydra.config.fields import help_of
from art_hydra.config.schema import RunConfig

#: The dialect the document declares.
DIALECT = "https://json-schema.org/draft/2020-12/schema"

#: Where the generated schema ships, next to this module (package data of the wheel).
SHIPPED = Path(__file__).with_name("run_config.schema.json")

#: ``${...}`` (an interpolation, resolved at composition) or ``???`` (a mandatory value).
INTERPOLATION = {
    "description": "An interpolation (${...}) resolved at composition, or ??? (a value "
    "that must be given before the run).",
    "type": "string",
    "anyOf": [{"pattern": r"\$\{.*\}"}, {"const": "???"}],
}

#: Default-list keys: a group, optionally with Hydra's prefixes and a package suffix.
_GROUP_KEY = r"^(override |optional )?/?{group}(@[\w.]*)?$"


def _description(cls: type, name: str) -> str:
    """The help of field ``name`` of dataclass ``cls``, from its metadata."""
    return help_of(cls, name)


def _ref(name: str) -> dict[str, Any]:
    return {"$ref": f"#/$defs/{name}"}


def _or_interpolation(schema: dict[str, Any]) -> dict[str, Any]:
    """A value schema that also accepts an interpolation or ``???``."""
    return {"anyOf": [schema, _ref("interpolation")]}


def _json_default(value: Any) -> Any:
    """A default as JSON (enums by name, as OmegaConf reads them)."""
    if isinstance(value, Enum):
        return value.name
    if isinstance(value, (list, tuple)):
        return [_json_default(v) for v in value]
    if isinstance(value, dict):
        return {str(k): _json_default(v) for k, v in value.items()}
    if dataclasses.is_dataclass(value) and not isinstance(value, type):
        return {f.name: _json_default(getattr(value, f.name)) for f in dataclasses.fields(value)}
    return value


def _type_schema(hint: Any) -> dict[str, Any]:
    """The JSON Schema of a typing hint (leaf types and containers)."""
    origin = typing.get_origin(hint)
    if origin in (typing.Union, types.UnionType):
        members = [a for a in typing.get_args(hint) if a is not type(None)]
        inner = _type_schema(members[0]) if len(members) == 1 else {}
        return {"anyOf": [inner, {"type": "null"}]}
    if origin is list:
        (item,) = typing.get_args(hint) or (Any,)
        return {"type": "array", "items": _or_interpolation(_type_schema(item))}
    if origin is dict or hint is dict:
        return {"type": "object"}
    if dataclasses.is_dataclass(hint):  # an entry of a list (task.rewards): open
        hints = type_hints(hint)
        return {
            "type": "object",
            "description": " ".join((hint.__doc__ or "").split()),
            "properties": {
                f.name: {
                    **_or_interpolation(_type_schema(hints[f.name])),
                    "description": help_text,
                }
                for f in dataclasses.fields(hint)
                if (help_text := f.metadata.get("help", ""))
            },
            "required": [f.name for f in dataclasses.fields(hint) if f.default is MISSING],
            "additionalProperties": True,
        }
    if isinstance(hint, type) and issubclass(hint, Enum):
        return {"type": "string", "enum": [m.name for m in hint]}
    simple = {bool: "boolean", int: "integer", float: "number", str: "string"}
    if hint in simple:
        return {"type": simple[hint]}
    return {}


def _bound_schema(bound: Bound, base: dict[str, Any]) -> dict[str, Any]:
    """``base`` narrowed by a bound's limits."""
    limits: dict[str, Any] = {}
    for key, word in (
        ("gt", "exclusiveMinimum"),
        ("ge", "minimum"),
        ("lt", "exclusiveMaximum"),
        ("le", "maximum"),
    ):
        value = getattr(bound, key)
        if value is not None:
            limits[word] = int(value) if float(value).is_integer() else value
    if bound.nonempty:
        limits.update(minLength=1, minItems=1)
    if bound.registry:
        from art_hydra.config.key_registries import registered_names

        # Open: a plugin or launcher script may register more; these are the known ones.
        return {"type": "string", "examples": list(registered_names(bound.registry))}
    if bound.choices:
        spellings = [*bound.choices, *(alias for alias, _ in bound.aliases)]
        choice: dict[str, Any] = {"type": "string", "enum": spellings}
        if {a.lower() for a, _ in bound.aliases} & {"true", "false"}:
            # YAML 1.1 (OmegaConf's reader) reads a bare on/off/true/false as a boolean.
            return {"anyOf": [choice, {"type": "boolean"}]}
        return choice
    return {"allOf": [base, limits]} if limits else base


def _when_off(when: tuple[str, Any], prefix: str) -> dict[str, Any] | None:
    """A schema (for the object at dotted ``prefix``) true when the file sets the
    ``when`` key to another value; None where that key lies outside the object."""
    key, value = when
    if not key.startswith(prefix):
        return None
    path = key[len(prefix) :].split(".")
    wanted = value.name if isinstance(value, Enum) else value
    schema: dict[str, Any] = {"not": {"const": wanted}}
    for part in reversed(path):
        schema = {"type": "object", "properties": {part: schema}, "required": [part]}
    return schema


class _Builder:
    """Walks the dataclasses once, collecting one ``$defs`` entry per class."""

    def __init__(self) -> None:
        self.defs: dict[str, Any] = {}

    def section(self, cls: type, prefix: str, bounds: bool = True) -> dict[str, Any]:
        """A reference to the schema of dataclass ``cls`` (at dotted ``prefix``)."""
        name = cls.__name__ if bounds else f"{cls.__name__}.unbounded"
        if name not in self.defs:
            self.defs[name] = {}  # a placeholder stops recursion
            self.defs[name] = self._object(cls, prefix, bounds)
        return _ref(name)

    def _object(self, cls: type, prefix: str, bounds: bool) -> dict[str, Any]:
        properties: dict[str, Any] = {}
        conditional: list[dict[str, Any]] = []
        hints = type_hints(cls)
        for f in dataclasses.fields(cls):
            hint = hints[f.name]
            if dataclasses.is_dataclass(hint):
                prop, bounded = self._section_field(cls, f, hint, prefix, bounds)
            else:
                prop, bounded = self._leaf(cls, f, hint, bounds)
            properties[f.name] = prop
            if bounded is not None:
                off = _when_off(self._when(f), prefix)
                conditional.append(
                    {"if": off, "else": {"properties": {f.name: bounded}}}
                    if off is not None
                    else {"properties": {f.name: bounded}}
                )
        schema: dict[str, Any] = {
            "type": "object",
            "title": cls.__name__,
            "description": (cls.__doc__ or "").strip(),
            "properties": properties,
            "additionalProperties": False,
        }
        if conditional:
            schema["allOf"] = conditional
        return schema

    @staticmethod
    def _when(f: dataclasses.Field[Any]) -> Any:
        bound = f.metadata.get("bound")
        return f.metadata.get("when") or (bound.when if bound is not None else None)

    def _section_field(
        self, owner: type, f: dataclasses.Field[Any], cls: type, prefix: str, bounds: bool
    ) -> tuple[dict[str, Any], dict[str, Any] | None]:
        """A nested section; with a ``when`` its bounds hold only where it is used."""
        path = f"{prefix}{f.name}"
        doc = _description(owner, f.name)
        if f.metadata.get("when") is None or not bounds:
            return {**self.section(cls, f"{path}.", bounds), **_maybe(doc)}, None
        typed = self.section(cls, f"{path}.", bounds=False)
        return {**typed, **_maybe(doc)}, self.section(cls, f"{path}.")

    def _leaf(
        self, cls: type, f: dataclasses.Field[Any], hint: Any, bounds: bool
    ) -> tuple[dict[str, Any], dict[str, Any] | None]:
        """A value field: its type, default and description; its bound apart when the
        bound is conditional (or the section's bounds are off)."""
        base = _type_schema(hint)
        bound: Bound | None = f.metadata.get("bound")
        words = [_description(cls, f.name)]
        if bound is not None and (bound.gt, bound.ge, bound.lt, bound.le) != (None,) * 4:
            words.append(describe(bound).capitalize() + (f": {bound.why}" if bound.why else "."))
        elif bound is not None and bound.nonempty:
            words.append("Must not be empty.")
        if bound is not None and bound.when is not None:
            words.append(f"(Checked when {bound.when[0]}={_json_default(bound.when[1])}.)")
        default = schema_default(cls, f.name)
        if default is MISSING:
            words.append("No default: a value must be given.")
        prop: dict[str, Any] = {"description": " ".join(w for w in words if w)}
        if default is not MISSING:
            prop["default"] = _json_default(default)
        if bound is None:
            return {**prop, **_or_interpolation(base)}, None
        limited = _or_interpolation(_bound_schema(bound, base))
        if bound.choices or bound.registry or (bounds and bound.when is None):
            return {**prop, **limited}, None
        return {**prop, **_or_interpolation(base)}, (limited if bounds else None)


def _maybe(doc: str) -> dict[str, Any]:
    return {"description": doc} if doc else {}


def conf_dir() -> Path:
    """The shipped config folder (``art_hydra.conf``, found without importing it)."""
    spec = importlib.util.find_spec("art_hydra.conf")
    if spec is not None and spec.submodule_search_locations:
        return Path(next(iter(spec.submodule_search_locations)))
    return Path(__file__).resolve().parents[2] / "conf"


def group_options(folders: Iterable[Path]) -> dict[str, list[str]]:
    """Each config group found in ``folders`` (``model``, ``hydra/launcher``) mapped to
    its options (the file names without ``.yaml``)."""
    groups: dict[str, set[str]] = {}
    for folder in folders:
        for path in sorted(Path(folder).rglob("*.yaml")):
            group = path.parent.relative_to(folder).as_posix()
            if group != ".":
                groups.setdefault(group, set()).add(path.stem)
    return {group: sorted(options) for group, options in sorted(groups.items())}


def _hydra_file_keys(folders: Iterable[Path]) -> list[str]:
    """The keys Hydra's own settings files may hold: Hydra's ``hydra`` node, plus every
    key of the ``hydra/`` group files in ``folders`` (launcher and sweeper settings are
    each plugin's own)."""
    from hydra.conf import HydraConf
    from omegaconf import DictConfig, OmegaConf

    keys = {f.name for f in dataclasses.fields(HydraConf)}
    for folder in folders:
        for path in sorted((Path(folder) / "hydra").rglob("*.yaml")):
            loaded = OmegaConf.load(path)
            if isinstance(loaded, DictConfig):
                keys.update(str(key) for key in loaded)
    return sorted(keys)


def _defaults_list(groups: dict[str, list[str]]) -> dict[str, Any]:
    """Hydra's defaults list: config names, and ``group: option`` entries naming the
    groups of the config folder (``override /group`` included)."""
    entries: dict[str, Any] = {}
    patterns: dict[str, Any] = {}
    for group, options in groups.items():
        choice = {"anyOf": [{"enum": [*options, None]}, _ref("interpolation")]}
        if group.startswith("hydra/"):
            # Hydra and its plugins bring options of their own (basic, submitit_slurm).
            choice = {"type": ["string", "null"]}
        entries[group] = entries[f"override /{group}"] = choice
        patterns[_GROUP_KEY.format(group=group)] = choice
    patterns[_GROUP_KEY.format(group=r"hydra/[\w/]+")] = {"type": ["string", "null"]}
    entry = {
        "type": "object",
        "description": "group: option (override /group: option replaces a choice).",
        "minProperties": 1,
        "maxProperties": 1,
        "properties": entries,
        "patternProperties": patterns,
        "additionalProperties": False,
    }
    return {
        "type": "array",
        "description": "Hydra's defaults list: the configs this one is composed from, "
        "and one option per config group.",
        "items": {"anyOf": [{"type": "string"}, entry]},
    }


def _file(builder: _Builder, cls: type, prefix: str, title: str, **extra: Any) -> dict[str, Any]:
    """The schema of ``cls`` as a whole file: its keys plus ``defaults`` (and ``extra``).

    A copy, not a reference: ``additionalProperties: false`` sees only the properties
    beside it, so the file's own keys must sit in the same object.
    """
    name = builder.section(cls, prefix)["$ref"].rsplit("/", 1)[1]
    schema = dict(builder.defs[name])
    schema["title"] = title
    schema["properties"] = {**schema["properties"], "defaults": _ref("defaults"), **extra}
    return schema


def _sections(cls: type, prefix: str = "") -> list[tuple[str, type]]:
    """Every section below ``cls``: (dotted path, dataclass)."""
    found: list[tuple[str, type]] = []
    for f in dataclasses.fields(cls):
        hint = type_hints(cls)[f.name]
        if dataclasses.is_dataclass(hint):
            found.append((f"{prefix}{f.name}", hint))
            found.extend(_sections(hint, f"{prefix}{f.name}."))
    return found


def build(extra_dirs: Iterable[Path | str] = ()) -> dict[str, Any]:
    """The schema of an art_hydra config file; ``extra_dirs`` (``--config-dir``
    folders) add their groups and options to those of the shipped ``conf/``."""
    folders = [conf_dir(), *(Path(d) for d in extra_dirs)]
    groups = group_options(folders)
    builder = _Builder()
    alternatives = [
        _file(
            builder,
            RunConfig,
            "",
            "A whole-run file (config.yaml, an experiment, a # @package _global_ file)",
            hydra={"type": "object", "description": "Hydra's own settings."},
        )
    ]
    for path, cls in _sections(RunConfig):
        folder = path.replace(".", "/")
        title = f"The {path} section (a file of the {folder}/ group in its default package)"
        alternatives.append(_file(builder, cls, f"{path}.", title))
    alternatives.append(
        {
            "title": "Hydra's own settings (a file under hydra/)",
            "type": "object",
            "properties": {
                key: _ref("defaults") if key == "defaults" else {}
                for key in _hydra_file_keys(folders)
            },
            "additionalProperties": False,
        }
    )
    builder.defs["defaults"] = _defaults_list(groups)
    builder.defs["interpolation"] = INTERPOLATION
    builder.defs["groups"] = {
        "description": "The config groups of the config folder and their options.",
        "const": groups,
    }
    return {
        "$schema": DIALECT,
        "title": "art_hydra config file",
        "description": "A config file of art_hydra (conf/ or a --config-dir folder): a "
        "whole run, one section, or Hydra's settings. Generated by `art-hydra --schema` "
        "from art_hydra/config/schema.py.",
        "type": ["object", "null"],
        "anyOf": [{"type": "null"}, *alternatives],
        "$defs": {name: builder.defs[name] for name in sorted(builder.defs)},
    }


def render(extra_dirs: Iterable[Path | str] = ()) -> str:
    """The schema as the text ``art-hydra --schema`` prints and the wheel ships."""
    return json.dumps(build(extra_dirs), indent=2, ensure_ascii=False) + "\n"


def write(path: Path = SHIPPED) -> None:
    """Regenerate the shipped schema atomically (temp file, then rename)."""
    text = render()
    tmp = path.with_suffix(".tmp")
    tmp.write_text(text, encoding="utf-8")
    tmp.replace(path)


if __name__ == "__main__":
    # python -m art_hydra.config.json_schema --write  (regenerates the shipped copy)
    if sys.argv[1:] == ["--write"]:
        write()
    else:
        sys.stdout.write(render(sys.argv[1:]))
