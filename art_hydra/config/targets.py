"""Dotted targets (rewards, generators) resolve only to code written to be one.

A config value that names a function is code the run will execute, and a config file
may come from elsewhere (a shared experiment, a colleague's ``--config-dir``). So a
target is eligible only when it is

* a function (or, for a reward, a class whose instances are callable: it is instantiated
  with its entry's other keys, see :mod:`art_hydra.tasks.base`) carrying the marker of
  its role (``@reward`` / ``@generator``, from :mod:`art_hydra.tasks.markers`, also
  ``from art_hydra import reward, generator``), or
* named by the user's own hand: the target itself set on the command line (or by the
  Python caller), or a function of a module listed in ``task.allowed_modules`` given on
  the command line (a config file cannot widen what may run: see
  :mod:`art_hydra.config.trust`).

Whatever route names them, some targets are never eligible, and are refused at
composition without importing anything: the standard library, the libraries of
:data:`LIBRARIES` (their functions load pickles, write files, start processes, and were
never written to be called with a prompt), ``__main__``, and every ``art_hydra.*`` path
that is not one of art_hydra's own marked rewards and generators (:data:`ART_HYDRA_REWARDS`,
:data:`ART_HYDRA_GENERATORS`: a static registry, so composition needs no import; a test
keeps it equal to the marked functions). Rewards are called by parameter name
(``reward(prompt=..., completion=..., answer=...)``) and generators as
``generator(rng=..., num_examples=..., **task.params)``, so a library function that
happens to take three positional arguments cannot be called as one.

Whether a function named by a config file carries its marker is decided in two steps:
before anything is imported, the module's source is located on ``sys.path`` without
executing it (the parent packages are not imported) and read with :mod:`ast`; a
top-level ``def`` without a ``@reward``/``@generator`` decorator is refused there. Only
then is the module imported, and the marker the decorator really set is confirmed on
the function object (a re-export, or a source that cannot be read statically, is
decided by this second step alone).
"""

from __future__ import annotations

import ast
import importlib
import importlib.machinery
import importlib.util
import inspect
import os
import re
import sys
from collections.abc import Iterable
from pathlib import Path
from typing import Any

#: The attribute the markers set on a function (or class): its role ("reward",
#: "generator", "environment" or "tool").
ROLE_ATTR = "__art_hydra_role__"
#: Roles, by config key (and every ``task.rewards.N._target_`` is a reward, every
#: ``task.tools.N`` a tool: :func:`key_role`).
ROLE_OF_KEY = {
    "task.reward._target_": "reward",
    "task.generator": "generator",
    "task.environment._target_": "environment",
}
_REWARD_ENTRY = re.compile(r"^task\.rewards\.\d+\._target_$")
_TOOL_ENTRY = re.compile(r"^task\.tools\.\d+$")


def key_role(key: str) -> str:
    """The role of the code ``key`` names: ``task.reward._target_`` and every
    ``task.rewards.N._target_`` name a reward, ``task.generator`` a generator,
    ``task.environment._target_`` an environment (a class) and every ``task.tools.N`` a
    tool (a function)."""
    if _REWARD_ENTRY.match(key):
        return "reward"
    if _TOOL_ENTRY.match(key):
        return "tool"
    return ROLE_OF_KEY[key]


#: art_hydra's own marked rewards and generators: the only ``art_hydra.*`` targets.
ART_HYDRA_REWARDS = frozenset(
    {"art_hydra.tasks.rewards.exact_match", "art_hydra.tasks.rewards.char_overlap"}
)
ART_HYDRA_GENERATORS = frozenset(
    {
        "art_hydra.tasks.toy.reverse_examples",
        "art_hydra.tasks.toy.digit_sum_examples",
        "art_hydra.tasks.tool_lookup.lookup_examples",
    }
)
#: art_hydra's own marked environment classes and tool functions (the demo's).
ART_HYDRA_ENVIRONMENTS = frozenset({"art_hydra.tasks.tool_lookup.LookupEnv"})
ART_HYDRA_TOOLS = frozenset({"art_hydra.tasks.tool_lookup.lookup"})
#: Each role's own art_hydra targets.
_OWN = {
    "reward": ART_HYDRA_REWARDS,
    "generator": ART_HYDRA_GENERATORS,
    "environment": ART_HYDRA_ENVIRONMENTS,
    "tool": ART_HYDRA_TOOLS,
}

#: Libraries whose functions are never a reward or a generator, by top-level package.
#: A list, not a rule, because nothing in a function says "this is a library gadget":
#: ``numpy.load``, ``joblib.load``, ``pandas.read_pickle``, ``torch.load`` unpickle the
#: file their first argument names, ``matplotlib.pyplot.savefig`` writes one, and so on.
#: Generous on purpose: the ML stack art_hydra runs on, the serialisation libraries, and
#: the tooling installed beside it; a user's own package is never among them.
LIBRARIES = frozenset(
    {
        # Serialisation and pickles.
        "joblib", "dill", "cloudpickle", "jsonpickle", "msgpack", "yaml", "ruamel",
        "pickle5", "h5py", "tables", "pyarrow", "fastparquet", "orjson", "ujson",
        # The array, data and science stack.
        "numpy", "pandas", "polars", "scipy", "sklearn", "sympy", "mpmath", "networkx",
        "numba", "numexpr", "statsmodels", "xarray", "PIL", "cv2", "imageio",
        # Deep learning and model tooling.
        "torch", "torchvision", "torchaudio", "functorch", "triton", "transformers", "peft",
        "safetensors", "datasets", "tokenizers", "sentencepiece", "tiktoken",
        "huggingface_hub", "accelerate", "trl", "unsloth", "unsloth_zoo", "bitsandbytes",
        "xformers", "deepspeed", "vllm", "flash_attn", "evaluate", "diffusers", "timm",
        "tensorflow", "keras", "jax", "jaxlib", "flax", "optax", "onnx", "onnxruntime",
        # Configuration, launching, logging and plotting.
        "hydra", "hydra_plugins", "omegaconf", "antlr4", "submitit", "matplotlib",
        "mpl_toolkits", "seaborn", "plotly", "tensorboard", "tensorboardX", "wandb",
        "mlflow", "tqdm", "rich", "click", "typer", "fire",
        # Files, processes, networks and shells.
        "fsspec", "filelock", "psutil", "requests", "urllib3", "httpx", "aiohttp",
        "paramiko", "fabric", "invoke", "sh", "plumbum", "pexpect", "ptyprocess",
        "docker", "git", "boto3", "botocore", "s3fs", "gcsfs", "google", "grpc",
        # Code loaders and the interpreter's own tooling.
        "jinja2", "mako", "cffi", "Cython", "IPython", "ipykernel", "jupyter_client",
        "pip", "setuptools", "pkg_resources", "_distutils_hack", "wheel", "packaging",
        "importlib_metadata", "importlib_resources", "pytest", "_pytest", "pluggy",
        "coverage", "typing_extensions", "six", "attr", "attrs", "regex", "loky",
    }
)  # fmt: skip

#: Names that are never modules of the user's code.
_NEVER = frozenset({"__main__", "__mp_main__"})

_DOTTED = re.compile(r"^[A-Za-z_]\w*(\.[A-Za-z_]\w*)+$")


class TargetError(ValueError):
    """A target that may not or cannot be used; the message says why and what to do."""


class NotMarkedError(TargetError):
    """A function a config file named that is not marked for its role."""


def _under(module: str, prefix: str) -> bool:
    return module == prefix or module.startswith(prefix + ".")


def _prefixes(path: str) -> list[str]:
    parts = path.split(".")
    return [".".join(parts[: i + 1]) for i in range(len(parts))]


def _stdlib(path: str) -> str | None:
    """The standard-library module ``path`` lies in (checked at every dotted prefix, so
    ``os.path.join`` and ``xml.etree.ElementTree.parse`` are both caught), or None."""
    names = sys.stdlib_module_names | set(sys.builtin_module_names) | _NEVER
    return next((p for p in _prefixes(path) if p in names), None)


def _library(path: str) -> str | None:
    top = path.partition(".")[0]
    return top if top in LIBRARIES else None


def _own(role: str) -> frozenset[str]:
    return _OWN[role]


def _shape(role: str) -> str:
    """What a target of ``role`` is, for messages."""
    return "class (module.Class)" if role == "environment" else "function (module.function)"


def refusal(path: Any, key: str) -> str | None:
    """Why ``path`` may never be used as ``key``, whoever names it (None when it may be,
    if eligible); imports nothing."""
    role = key_role(key)
    if path is None or not _DOTTED.match(str(path)):
        return f"must be the dotted path of a {_shape(role)}, not {path!r}."
    path = str(path)
    module = path.rpartition(".")[0]
    if "__main__" in path.split("."):
        return "names a __main__ module, a program's entry point: importing it runs the program."
    stdlib = _stdlib(path)
    if stdlib is not None:
        return (
            f"names the standard-library module '{stdlib}'; a {role} runs as part of "
            "training, so only functions written as one may be named."
        )
    library = _library(path)
    if library is not None:
        return (
            f"names a function of the library '{library}', which is never a {role}: library "
            "functions load files (often pickles), write them or start processes, and were not "
            f"written to be called as a {role}; write your own function and mark it @{role}."
        )
    if _under(module, "art_hydra") and path not in _own(role):
        return (
            f"is not one of art_hydra's own {role}s ({', '.join(sorted(_own(role)))}); "
            f"art_hydra's other functions are never a {role}."
        )
    return None


def refused_module(module: str) -> bool:
    """Whether ``module`` may never be listed in ``task.allowed_modules``."""
    return bool(_stdlib(module) or _library(module) or _under(module, "art_hydra"))


def marker_in_source(path: str, role: str) -> bool | None:
    """Whether the source of ``path``'s module decorates the top-level ``def`` (or
    ``class``: a reward may be a class whose instances are called) of its function with
    ``@<role>`` (``@reward(...)``, ``@art_hydra.reward``, ...), read
    without executing anything; None when the source or the ``def`` cannot be found
    statically (a re-export, an extension module, a finder with no file)."""
    module, _, name = path.rpartition(".")
    source = module_source(module)
    if source is None:
        return None
    decorators = _top_level_decorators(source)
    if decorators is None or name not in decorators:
        return None
    return role in decorators[name]


#: (resolved path, inode, size, mtime_ns, ctime_ns) -> each top-level def's decorator
#: names (the last def of a name wins); a sweep's world checks ask about the same few
#: files at every point. The inode and ctime tell a file replaced (renamed over, or its
#: mtime set back) within the same mtime tick.
_DECORATORS: dict[tuple[str, int, int, int, int], dict[str, tuple[str | None, ...]]] = {}
_DECORATORS_MAX = 64


def _top_level_decorators(source: Path) -> dict[str, tuple[str | None, ...]] | None:
    """Decorator names of each top-level ``def``/``class`` in ``source``, parsed once per
    version of the file (None: it cannot be read or parsed)."""
    try:
        before = source.stat()
        key = (str(source.resolve()), *_version(before))
        if key in _DECORATORS:
            return _DECORATORS[key]
        tree = ast.parse(source.read_text(encoding="utf-8"), filename=str(source))
        after = source.stat()
    except (OSError, SyntaxError, UnicodeDecodeError, ValueError):
        return None
    found = {
        node.name: tuple(_decorator_name(d) for d in node.decorator_list)
        for node in tree.body
        if isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef, ast.ClassDef))
    }
    if _version(after) == key[1:]:  # not changed while read
        if len(_DECORATORS) >= _DECORATORS_MAX:
            _DECORATORS.pop(next(iter(_DECORATORS)))
        _DECORATORS[key] = found
    return found


def _version(stat: os.stat_result) -> tuple[int, int, int, int]:
    return (stat.st_ino, stat.st_size, stat.st_mtime_ns, stat.st_ctime_ns)


def _decorator_name(node: ast.expr) -> str | None:
    if isinstance(node, ast.Call):
        node = node.func
    if isinstance(node, ast.Name):
        return node.id
    if isinstance(node, ast.Attribute):
        return node.attr
    return None


def module_origin(module: str) -> str | None:
    """Where ``module`` would be loaded from (a file, or "built-in"), found on the import
    path without importing it or its parent packages; None if it cannot be found so."""
    if module in sys.modules:
        return getattr(sys.modules[module], "__file__", None) or "built-in"
    parts = module.split(".")
    try:
        spec = importlib.util.find_spec(parts[0])  # a top-level name imports nothing
        for i in range(1, len(parts)):
            locations = spec.submodule_search_locations if spec is not None else None
            if locations is None:
                return None
            spec = importlib.machinery.PathFinder.find_spec(".".join(parts[: i + 1]), locations)
    except (ImportError, ValueError, AttributeError):
        return None
    return spec.origin if spec is not None else None


def module_source(module: str) -> Path | None:
    """The ``.py`` file of ``module`` (see :func:`module_origin`), or None."""
    origin = module_origin(module)
    return Path(origin) if origin and origin.endswith(".py") else None


def role_of(fn: Any) -> str | None:
    """The role the marker set on ``fn`` (None: unmarked)."""
    role = getattr(fn, ROLE_ATTR, None)
    return role if isinstance(role, str) else None


def not_found(module: str, key: str) -> str:
    """Why ``module`` cannot be imported, and where the command looks for it."""
    top = module.partition(".")[0]
    return (
        f"no module named '{module}' is installed or on sys.path. The folder you run "
        "art-hydra in is not on the import path (a data folder's files are data): a module "
        "there is imported only when the command line names it, e.g. "
        f"{key}={module}.<function> or task.allowed_modules=[{top}]; or install it, or "
        "put its folder on PYTHONPATH."
    )


def _a(role: str) -> str:
    return f"an {role}" if role[0] in "aeiou" else f"a {role}"


def not_marked(path: str, key: str) -> str:
    """Why a function a config file named may not run, and both ways to allow it."""
    role = key_role(key)
    module = path.rpartition(".")[0]
    if module_origin(module) is None:
        return f"names '{path}': {not_found(module, key)}"
    what = {"reward": "a def or class", "environment": "a class"}.get(role, "a def")
    where = "class" if role == "environment" else "def"
    kinds = "classes" if role == "environment" else "functions"
    return (
        f"names '{path}', which is not marked as {_a(role)} ({what} "
        f"decorated @{role} in its "
        "module's source, read without running it), and a config file may name only "
        f"{kinds} written as one. If it is yours, mark it (from art_hydra import {role}; "
        f"@{role}{'(needs_answer=...)' if role == 'reward' else ''} above its {where}); or, if "
        f"you trust it as it is, name it on the command line: {key}={path} (or "
        f"task.allowed_modules=[{module}])."
    )


def resolve(path: str, key: str, *, by_hand: bool = True, hand_modules: Iterable[str] = ()) -> Any:
    """Import and return the function ``path`` names, or raise :class:`TargetError`.

    ``by_hand``: the user named this target themselves (command line, Python caller);
    ``hand_modules``: ``task.allowed_modules`` as the user gave it by hand. Otherwise the
    function must carry the marker of its role, checked in the source before the module
    is imported, then on the object.
    """
    why = refusal(path, key)
    if why is not None:
        raise TargetError(why)
    role = key_role(key)
    module_name, _, attr = path.rpartition(".")
    hand_modules = tuple(str(m) for m in hand_modules)
    trusted = by_hand or any(_under(module_name, m) for m in hand_modules)
    if not trusted and marker_in_source(path, role) is not True:
        # Nothing of a module a config file named runs before its marker is seen: a def
        # that cannot be found in the source without running it is refused.
        raise NotMarkedError(not_marked(path, key))
    try:
        found = importlib.util.find_spec(module_name) is not None
    except (ImportError, ValueError):
        found = False
    if not found:
        raise TargetError(not_found(module_name, key))
    try:
        module = importlib.import_module(module_name)
    except Exception as exc:
        raise TargetError(f"importing '{module_name}' failed: {type(exc).__name__}: {exc}") from exc
    obj = getattr(module, attr, None)
    if obj is None:
        raise TargetError(f"module '{module_name}' has no attribute '{attr}'.")
    if role == "environment":
        if not inspect.isclass(obj):
            raise TargetError(
                f"is a {type(obj).__name__}, not a class: an environment is a class in TRL's "
                "environment_factory shape (one instance per rollout, reset(**row), its public "
                "methods the tools)."
            )
    elif inspect.isclass(obj) and role == "reward":
        if not callable_instances(obj):
            raise TargetError(
                f"is the class '{obj.__qualname__}', whose instances cannot be called: a "
                "reward class defines __call__(self, prompt, completion, answer) (per sample) "
                "or __call__(self, prompts, completions, **kwargs) (batched, as TRL)."
            )
    elif not inspect.isfunction(obj):
        also = " or a class whose instances are callable" if role == "reward" else ""
        raise TargetError(
            f"is a {type(obj).__name__}, not a plain Python function{also} defined in your code."
        )
    return _eligible(obj, path, key, trusted, (module_name, *hand_modules))


def callable_instances(cls: type) -> bool:
    """Whether instances of ``cls`` can be called: a class of its own (not ``object``)
    defines ``__call__`` (every class is callable itself, through ``type.__call__``)."""
    return any("__call__" in vars(k) for k in cls.__mro__ if k is not object)


def _eligible(fn: Any, path: str, key: str, trusted: bool, modules: tuple[str, ...]) -> Any:
    role = key_role(key)
    home = f"{fn.__module__ or ''}.{fn.__qualname__}"
    if refusal(home, key) is not None and home not in _own(role):
        raise TargetError(f"is '{home}' re-exported from '{path}': {refusal(home, key)}")
    marked = role_of(fn)
    if marked == role:
        return fn
    if marked is not None:
        raise TargetError(f"is marked as a {marked}, not a {role}.")
    if not trusted:
        raise NotMarkedError(not_marked(path, key))
    if not any(_under(fn.__module__ or "", m) for m in modules):
        raise TargetError(
            f"is '{home}' re-exported from '{path.rpartition('.')[0]}'; its own module "
            f"'{fn.__module__}' was not named, and the function is not marked as a {role}."
        )
    return fn
