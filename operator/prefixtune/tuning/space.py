"""The search space: which knobs are tuned, over which values, and how they map to skopt and back.

Built from the engine adapter's knob specs and the resource's optional space override. A knob with
more than one allowed value enters the space when the adapter searches it by default
(``searched=True``), when the override lists it, or when the policy widened the epoch's space with
it (``widen``: the batch limits where they bind); the others stay at the base config's value.
Equivalent configurations (a cache-aware policy with caching off) are collapsed through the
adapter's ``normalize()`` (and, with a router, the thresholds of every policy but cache_aware:
``tuning/routed.py``): every point maps to a normalized KnobConfig, and the grid holds each
normalized config once.

Categorical values are passed to skopt as strings (skopt's transformers and numpy do not round-trip
bools and ints reliably); every value coming back is converted to a plain Python value.
"""

from __future__ import annotations

import itertools
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass
from typing import Any

from prefixtune.engines.base import (
    BLOCK_SIZE,
    KNOB_NAMES,
    MEMORY_FRACTION,
    PREFIX_CACHING,
    SCHEDULE_POLICY,
    KnobConfig,
    KnobSpec,
)
from prefixtune.engines.knobs import BY_NAME, MEMORY_KNOB, Restarts, Value, categorical_key, memory_of
from prefixtune.tuning.routed import Routing, canonical_thresholds, collapse, resolved, routed_knobs
from prefixtune.tuning.settings import SpaceOverride

# Default search bounds for the memory fraction when the resource gives none: the engines accept
# (0, 1], but a KV pool below 60% of the engine's base wastes trials, and above 0.98 nothing boots.
DEFAULT_FRACTION_LOW = 0.60
DEFAULT_FRACTION_HIGH = 0.98
SkoptPoint = list[Any]  # a skopt point: floats for continuous dimensions, strings for categorical ones


class SpaceError(ValueError):
    """The space override names values the engine does not accept, or leaves nothing valid."""


@dataclass(frozen=True)
class Dimension:
    name: str
    low: float | None = None  # continuous
    high: float | None = None
    choices: tuple[Value, ...] = ()  # categorical

    @property
    def continuous(self) -> bool:
        return not self.choices

    def encode(self, value: Value) -> float | str:
        if self.continuous:
            return float(value)
        return _token(value)

    def decode(self, raw: Any) -> Value:
        if self.continuous:
            assert self.low is not None and self.high is not None
            return min(max(float(raw), self.low), self.high)
        token = str(raw)
        for choice in self.choices:
            if _token(choice) == token:
                return choice
        raise SpaceError(f"{self.name}: {raw!r} is not one of {', '.join(map(str, self.choices))}")


def _token(value: Value) -> str:
    if isinstance(value, bool):
        return "true" if value else "false"
    if isinstance(value, float):
        return repr(value)
    return str(value)


def _plain(value: Any) -> Value:
    """numpy scalars -> plain Python values."""
    if hasattr(value, "item"):
        value = value.item()
    if isinstance(value, bool | int | float | str):
        return value
    raise TypeError(f"not a plain knob value: {value!r}")


@dataclass(frozen=True)
class SearchSpace:
    base: KnobConfig  # the values of knobs that are not searched
    dims: tuple[Dimension, ...]
    normalize: Callable[[KnobConfig], KnobConfig]
    # the knobs that entered by ``widen`` (a batch limit the baseline showed binding), not by default
    widened: tuple[str, ...] = ()

    @property
    def names(self) -> tuple[str, ...]:
        return tuple(d.name for d in self.dims)

    @property
    def empty(self) -> bool:
        return not self.dims

    def dimension(self, name: str) -> Dimension | None:
        return next((d for d in self.dims if d.name == name), None)

    def to_skopt(self) -> list[Any]:
        from skopt.space import Categorical, Real

        out: list[Any] = []
        for d in self.dims:
            if d.continuous:
                out.append(Real(float(d.low or 0.0), float(d.high or 1.0), name=d.name))
            else:
                out.append(Categorical([_token(c) for c in d.choices], name=d.name))
        return out

    def to_config(self, point: Sequence[Any]) -> KnobConfig:
        """A skopt point -> the normalized KnobConfig (plain Python values)."""
        if len(point) != len(self.dims):
            raise SpaceError(f"point has {len(point)} values, space has {len(self.dims)} dimensions")
        values = {d.name: d.decode(_plain(raw)) for d, raw in zip(self.dims, point, strict=True)}
        return self.normalize(self.base.with_(**values))

    def to_point(self, config: KnobConfig) -> SkoptPoint:
        """A config -> its skopt point (config values outside the space are clipped / must be valid)."""
        data = config.to_dict()
        point: SkoptPoint = []
        for d in self.dims:
            value = data[d.name]
            if d.continuous:
                assert d.low is not None and d.high is not None
                point.append(min(max(float(value), d.low), d.high))
            else:
                if value not in d.choices:
                    raise SpaceError(
                        f"{d.name}={value!r} is outside the search space; allowed: "
                        + ", ".join(map(str, d.choices))
                    )
                point.append(_token(value))
        return point

    def contains(self, config: KnobConfig) -> bool:
        data = config.to_dict()
        for d in self.dims:
            value = data[d.name]
            if d.continuous:
                assert d.low is not None and d.high is not None
                if not d.low - 1e-9 <= float(value) <= d.high + 1e-9:
                    return False
            elif value not in d.choices:
                return False
        fixed = self.base.to_dict()
        return all(data[n] == fixed[n] for n in KNOB_NAMES if n not in self.names)

    def fraction_grid(self, n: int) -> tuple[float, ...]:
        """``n`` evenly spaced values of the memory knob over its range (the base's when not searched)."""
        d = self.dimension(MEMORY_KNOB.name)
        if d is None:
            return (memory_of(self.base),)
        assert d.low is not None and d.high is not None
        if n < 2:
            return (round(d.high, 4),)
        step = (d.high - d.low) / (n - 1)
        return tuple(round(d.low + i * step, 4) for i in range(n))

    def categorical_combos(self) -> list[KnobConfig]:
        """Every distinct normalized combination of the categorical knobs (fraction at base)."""
        cats = [d for d in self.dims if not d.continuous]
        seen: dict[KnobConfig, None] = {}
        for values in itertools.product(*(d.choices for d in cats)):
            cfg = self.normalize(self.base.with_(**{d.name: v for d, v in zip(cats, values, strict=True)}))
            seen.setdefault(cfg, None)
        return list(seen)

    def candidate_grid(self, n_fraction: int) -> list[KnobConfig]:
        """The grid the optimizer ranks its candidates on (besides random samples and skopt's own
        asked point, which cover the whole space): the full ``grid`` without router knobs; with
        them, the engine knobs' grid at the base's routing and the router knobs' combinations at the
        base's engine knobs, each over the fraction grid. The router and the engines are different
        devices whose effects compose to first order, and the full cross product (SGLang's engine
        combinations x 15 routing ones x 13 fractions, 17,550 configs) cost 3-5 s per decision."""
        routed = [d for d in self.dims if not d.continuous and BY_NAME[d.name].restarts is Restarts.ROUTER]
        if not routed:
            return self.grid(n_fraction)
        engine = [d for d in self.dims if not d.continuous and d not in routed]
        seen: dict[KnobConfig, None] = {}
        for part in (engine, routed):
            for values in itertools.product(*(d.choices for d in part)):
                combo = self.base.with_(**{d.name: v for d, v in zip(part, values, strict=True)})
                for f in self.fraction_grid(n_fraction):
                    seen.setdefault(self.normalize(combo.with_(**{MEMORY_KNOB.name: f})), None)
        return list(seen)

    def grid(self, n_fraction: int = 9) -> list[KnobConfig]:
        """The discretized space: fraction grid x distinct categorical combos, normalized, deduped."""
        seen: dict[KnobConfig, None] = {}
        for combo in self.categorical_combos():
            for f in self.fraction_grid(n_fraction):
                seen.setdefault(self.normalize(combo.with_(**{MEMORY_KNOB.name: f})), None)
        return list(seen)


def build_space(
    knobs: Mapping[str, KnobSpec],
    base: KnobConfig,
    normalize: Callable[[KnobConfig], KnobConfig],
    override: SpaceOverride | None = None,
    widen: Mapping[str, Sequence[Value]] | None = None,
    routing: Routing | None = None,
) -> SearchSpace:
    """The search space for one engine: adapter knob specs narrowed by the resource's override.

    A knob enters when the adapter searches it by default, when the override lists it (then over
    exactly the listed values, as ``spec.tuning.space`` says), or when ``widen`` names it: the
    values the policy decided to search after the baseline for a knob the adapter keeps fixed by
    default (the batch limits where they bind: ``tuning/widening.py``); a knob the override names is
    not widened.

    ``routing``: the resource's router and replicas, which decide whether the router's knobs enter
    (``tuning/routed.py``: with two replicas or more; by default when the baseline runs a router);
    the thresholds of a policy other than cache_aware are collapsed onto one value each. None:
    the adapter's table as it is (the router's knobs only where listed)."""
    override = override or SpaceOverride()
    own = base  # the resource's own config: ``auto`` resolves from it (``routed.resolved``)
    knobs = routed_knobs(knobs, base, routing, override)
    dims: list[Dimension] = []
    widened: list[str] = []
    for name in KNOB_NAMES:
        spec = knobs.get(name)
        wanted = override.get(name)
        if spec is None:
            continue
        if wanted is None and not spec.searched and widen and name in widen:
            wanted = tuple(widen[name])
            widened.append(name)
        if not spec.searched and wanted is None:
            continue
        if spec.continuous:
            bounds = None if wanted is None else (float(wanted[0]), float(wanted[1]))
            dim = _fraction_dim(spec, bounds)
            if dim is not None:
                dims.append(dim)
            elif bounds is not None:  # min == max: the fraction is fixed by the override
                base = base.with_(**{name: float(bounds[0])})
            continue
        allowed: tuple[Value, ...] = spec.choices
        if wanted is not None:
            if not wanted:
                raise SpaceError(f"space.{name}: must list at least one value; allowed: {_list(allowed)}")
            for value in wanted:
                problem = spec.validate(value)
                if problem is not None:
                    raise SpaceError(f"space.{name}: {value!r} {problem}")
            allowed = tuple(dict.fromkeys(wanted))
        if len(allowed) > 1:
            dims.append(Dimension(name=name, choices=allowed))
        elif allowed[0] != getattr(base, name):
            base = base.with_(**{name: allowed[0]})
    dims_names = {d.name for d in dims}
    if routing is not None:
        replicas = routing.replicas
        canonical = canonical_thresholds(base, {d.name: d.choices for d in dims})
        normalize = _chain(_chain(normalize, lambda c: resolved(c, replicas, own)), collapse(canonical))

    return SearchSpace(
        base=normalize(base),
        dims=tuple(dims),
        normalize=normalize,
        widened=tuple(n for n in widened if n in dims_names),
    )


def _chain(
    first: Callable[[KnobConfig], KnobConfig], then: Callable[[KnobConfig], KnobConfig]
) -> Callable[[KnobConfig], KnobConfig]:
    def normalize(config: KnobConfig) -> KnobConfig:
        return then(first(config))

    return normalize


def _fraction_dim(spec: KnobSpec, bounds: tuple[float, float] | None) -> Dimension | None:
    assert spec.low is not None and spec.high is not None
    if bounds is None:
        low, high = max(spec.low, DEFAULT_FRACTION_LOW), min(spec.high, DEFAULT_FRACTION_HIGH)
    else:
        low, high = float(bounds[0]), float(bounds[1])
        for which, value in (("min", low), ("max", high)):
            problem = spec.validate(value)
            if problem is not None:
                raise SpaceError(f"space.{spec.name}.{which}: {problem}")
        if low > high:
            raise SpaceError(f"space.{spec.name}: min {low} must not exceed max {high}")
    if high - low < 1e-6:
        return None
    return Dimension(name=spec.name, low=low, high=high)


def _list(values: Sequence[Value]) -> str:
    return ", ".join(map(str, values))


__all__ = [
    "BLOCK_SIZE",
    "MEMORY_FRACTION",
    "PREFIX_CACHING",
    "SCHEDULE_POLICY",
    "Dimension",
    "SearchSpace",
    "SpaceError",
    "build_space",
    "categorical_key",
]
