"""A sweep's search space read the way its sweeper reads it, and a key given twice refused.

Sweepers disagree on what a key given both fixed and swept means: Hydra's basic sweeper
keeps one entry per override key (``split_arguments``), so the later override of a key
replaces the earlier one (``rl.num_generations=8 rl.num_generations=choice(2,3)`` sweeps
2 and 3; only differently prefixed forms such as ``+k`` and ``k`` are crossed), while the
Optuna sweeper drops the key from its search space and runs every trial with the fixed
value (the study then searches nothing for it and ends with ``Best parameters: {}``). A key
swept twice is likewise searched once, the later way, by both, but the earlier sweep the
user wrote is silently lost. The pre-flight cannot know which was meant, so it refuses both
before any job, naming each value and the override to keep. A delete (``~k``) is neither
fixed nor swept: ``~k +k=choice(a,b)`` replaces an entry wholesale at each point, and both
sweepers run it so (the points' own checks refuse what cannot run).

Optuna also reads a space its own way: ``range(1,4)`` is an integer distribution whose
upper end (4) it may draw, unless its sampler is the grid one (then 1, 2, 3), and the
deprecated ``hydra.sweeper.search_space`` holds distributions, not overrides. Its space is
therefore read here with the plugin's own parser (``create_params_from_overrides``), so
the pre-flight checks what the study will draw: every value of an integer or stepped
distribution, computed with Optuna's own arithmetic (``0.1 + 2 * 0.1`` is drawn, and
written, as ``0.30000000000000004``), up to :data:`MAX_COMBINATIONS` values; a longer one,
and a continuous one, is checked at a sample of its values (:class:`Sampled`).
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from omegaconf import DictConfig, OmegaConf

from art_hydra import moved
from art_hydra.config.hydra_compat import raw_list
from art_hydra.config.problems import Problem, format_report
from art_hydra.sweeps.points import target_of
from art_hydra.sweeps.reports import fail

log = moved.logger(__name__)

#: The Optuna sweeper, as ``hydra/sweeper=optuna`` names it.
OPTUNA = "hydra_plugins.hydra_optuna_sweeper.optuna_sweeper.OptunaSweeper"
#: Where a sweeper reads overrides besides the command line.
PARAMS = "hydra.sweeper.params"
SEARCH_SPACE = "hydra.sweeper.search_space"
#: The most combinations of the finite dimensions checked before a study starts; a
#: dimension with more values than this is checked at a sample of them.
MAX_COMBINATIONS = 10_000


class Sampled(list):  # type: ignore[type-arg]
    """The values checked of a dimension that has more than are checked (a continuous
    interval's ends, a sample of a long range): that none of them can run does not mean
    no value can, so the study is not refused on them alone."""


def is_optuna(config: DictConfig) -> bool:
    """Whether the sweep's sweeper is Optuna's (which draws each trial's point as it goes)."""
    return target_of(config.hydra.sweeper) == OPTUNA


@dataclass(frozen=True)
class Given:
    """One way a key reaches the sweeper: where, the override as written, swept or not."""

    source: str
    text: str
    swept: bool

    @property
    def value(self) -> str:
        return self.text.split("=", 1)[1] if "=" in self.text else self.text


def sweeper_inputs(config: DictConfig) -> list[tuple[str, str]]:
    """``(source, override)`` in the order the sweeper reads them: ``hydra.sweeper.params``
    first, then the command line (Optuna reads ``hydra.sweeper.search_space`` instead of
    the params when it has no params)."""
    inputs: list[tuple[str, str]] = []
    params = OmegaConf.select(config, PARAMS, default=None)
    if isinstance(params, DictConfig):
        items = OmegaConf.to_container(params, resolve=False).items()
        inputs += [(PARAMS, f"{k}={v}") for k, v in items]
    inputs += [("the command line", str(o)) for o in raw_list(config.hydra.overrides.task)]
    return inputs


def given_twice(config: DictConfig) -> list[Problem]:
    """Each key the sweep gives both fixed and swept, or swept more than once."""
    from hydra.core.override_parser.overrides_parser import OverridesParser

    parser = OverridesParser.create()
    by_key: dict[str, list[Given]] = {}
    deleted: dict[str, Given] = {}
    for source, text in sweeper_inputs(config):
        try:
            (override,) = parser.parse_overrides([text])
        except Exception:
            continue  # the sweeper reports an override it cannot parse, in its own words
        package = f"@{override.package}" if override.package else ""
        key = f"{override.key_or_group}{package}"
        if override.is_delete():  # neither fixed nor swept: ``~k +k=a,b`` replaces an entry
            deleted.setdefault(key, Given(source, text, False))
            continue
        by_key.setdefault(key, []).append(Given(source, text, override.is_sweep_override()))
    if is_optuna(config) and OmegaConf.select(config, PARAMS, default=None) is None:
        space = OmegaConf.select(config, SEARCH_SPACE, default=None)
        for key, dist in (OmegaConf.to_container(space) if space else {}).items():
            text = f"{key}={dist}"
            by_key.setdefault(str(key), []).insert(0, Given(SEARCH_SPACE, text, True))
    found = [
        _given_twice_problem(key, given)
        for key, given in by_key.items()
        if len(given) > 1 and any(g.swept for g in given)
    ]
    if is_optuna(config):
        found += [
            _deleted_problem(key, gone, [g for g in by_key[key] if g.swept][-1])
            for key, gone in deleted.items()
            if any(g.swept for g in by_key.get(key, []))
        ]
    return found


def _deleted_problem(key: str, gone: Given, swept: Given) -> Problem:
    """A key deleted and swept in an Optuna study: Hydra's basic sweeper applies ``~k``
    then ``+k=a`` (an entry replaced at each point), but the Optuna sweeper writes its fixed
    overrides after each trial's drawn ones, so the delete undoes every draw."""
    return Problem(
        key,
        f"{gone.text} and {swept.value} (swept)",
        "is deleted and swept: the Optuna sweeper writes a trial's drawn values first and "
        f"its fixed overrides after them, so {gone.text} deletes the value every trial "
        "draws and the study searches nothing for it.",
        f"drop {gone.text} and sweep the key over its entry: ++{key}={swept.value}",
    )


def _given_twice_problem(key: str, given: list[Given]) -> Problem:
    """The problem of one key given twice: both values, what each sweeper would do, and
    the override to keep."""
    fixed = [g for g in given if not g.swept]
    swept = [g for g in given if g.swept]

    def shown(g: Given) -> str:
        where = "" if g.source == "the command line" else f", in {g.source}"
        return f"{g.value} ({'swept' if g.swept else 'fixed'}{where})"

    if fixed:
        what = (
            "is given both fixed and swept: the Optuna sweeper runs every trial with the "
            f"fixed value ({fixed[-1].value}) and searches nothing for it, while Hydra's "
            "basic sweeper keeps the later override of the key and drops the earlier one."
        )
    else:
        what = (
            "is swept more than once: both the Optuna sweeper and Hydra's basic sweeper "
            "search only the later one and drop the earlier one without a word."
        )
    keeps = [f"{_kept(g)} ({'sweep it' if g.swept else 'every job with it'})" for g in swept]
    keeps += [f"{_kept(fixed[-1])} (every job with it)"] if fixed else []
    return Problem(
        key,
        " and ".join(shown(g) for g in given),
        f"{what} Which one runs depends on the sweeper; the pre-flight cannot tell which "
        "was meant.",
        f"keep one and drop the other(s): {' or '.join(keeps)}",
    )


def _kept(given: Given) -> str:
    where = "" if given.source == "the command line" else f" in {given.source}"
    return f"{given.text}{where}"


def refuse_keys_given_twice(config: DictConfig) -> None:
    """Stop the sweep before anything is written if a key is given twice (one report)."""
    found = given_twice(config)
    if found:
        footer = "The study was not started." if is_optuna(config) else "No job was launched."
        header = f"The sweep gives {len(found)} key(s) more than one way:"
        fail(format_report(found, header=header, footer=footer))


def optuna_space(config: DictConfig) -> tuple[list[str], list[tuple[str, list[str]]]]:
    """``(fixed overrides, [(key, values to check)])`` of an Optuna study, parsed by the
    plugin itself: each distribution's values (a grid sampler's grid; an integer or
    stepped one, all of them up to :data:`MAX_COMBINATIONS`; otherwise a :class:`Sampled`
    few), each written as the plugin writes a trial's override."""
    from hydra_plugins.hydra_optuna_sweeper import _impl

    texts = [text for _, text in sweeper_inputs(config)]
    dists, fixed = _impl.create_params_from_overrides(texts)
    params = OmegaConf.select(config, PARAMS, default=None)
    space = OmegaConf.select(config, SEARCH_SPACE, default=None)
    if params is None and space is not None:
        made = {
            str(k): _impl.create_optuna_distribution_from_config(v)
            for k, v in OmegaConf.to_container(space).items()
        }
        dists = {**made, **dists}
    for name in fixed:
        dists.pop(name, None)
    grid = target_of(OmegaConf.select(config, "hydra.sweeper.sampler")).endswith("GridSampler")
    custom = OmegaConf.select(config, "hydra.sweeper.custom_search_space", default=None)
    if custom:
        log.info(
            "hydra.sweeper.custom_search_space=%s draws its parameters as each trial starts: "
            "each trial's point is checked then.",
            custom,
        )
    dims = [(name, _written(name, _values(d, grid))) for name, d in dists.items()]
    return [f"{k}={v}" for k, v in fixed.items()], dims


def _written(name: str, values: list[Any]) -> list[str]:
    """Each value as the plugin writes a trial's override, keeping a :class:`Sampled` mark."""
    texts = [f"{name}={v}" for v in values]
    return Sampled(texts) if isinstance(values, Sampled) else texts


def _values(distribution: Any, grid: bool) -> list[Any]:
    """The values of one Optuna distribution the pre-flight checks: what the study can
    draw, computed as Optuna computes a draw (:func:`_drawn`); a :class:`Sampled` few
    where there are more than :data:`MAX_COMBINATIONS` or infinitely many."""
    from hydra_plugins.hydra_optuna_sweeper._impl import OptunaSweeperImpl
    from optuna.distributions import CategoricalDistribution

    if isinstance(distribution, CategoricalDistribution):
        return list(distribution.choices)
    if grid:
        try:  # the plugin's own grid (it refuses continuous distributions itself)
            cells = list(OptunaSweeperImpl._to_grid_sampler_choices(None, distribution))  # type: ignore[arg-type]
            return cells if len(cells) <= MAX_COMBINATIONS else sample(cells, MAX_COMBINATIONS)
        except ValueError:
            pass
    low, high = distribution.low, distribution.high
    step = getattr(distribution, "step", None) or getattr(distribution, "q", None)
    name = type(distribution).__name__
    if name.startswith("IntLog"):
        step = 1  # Optuna rounds a log draw to an integer in [low, high]
    elif name.startswith("Log") or not step:
        return Sampled([low, high])  # continuous: any value between may be drawn
    count = round((high - low) / step) + 1
    if count <= MAX_COMBINATIONS:
        return [_drawn(distribution, i, step) for i in range(count)]
    picks = sample(list(range(count)), MAX_COMBINATIONS)
    return Sampled([_drawn(distribution, i, step) for i in picks])


def _drawn(distribution: Any, i: int, step: float) -> Any:
    """The ``i``-th value of a stepped distribution exactly as Optuna's samplers return it
    (``optuna._transform``: ``round(k) * step + low``, clipped to ``[low, high]``), so a
    checked value is the drawn one, float rounding included."""
    low, high = distribution.low, distribution.high
    value = min(max(i * step + low, low), high)
    return int(value) if isinstance(low, int) and isinstance(step, int) else float(value)


def sample(values: list[Any], most: int) -> Sampled:
    """At most ``most`` of ``values``, evenly spread, both ends kept."""
    if len(values) <= most:
        return Sampled(values)
    most = max(most, 2)
    picks = sorted({round(j * (len(values) - 1) / (most - 1)) for j in range(most)})
    return Sampled(values[p] for p in picks)
