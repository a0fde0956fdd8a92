"""Which configuration to try next: skopt rebuilt from the trial history at every decision.

Nothing here keeps state between calls that could change an answer. ``suggest(space, history,
seed)`` builds a fresh ``skopt.Optimizer`` (GP with a white-noise term, EI, Latin-hypercube initial
design, fixed seed), tells it every finished trial in one batch, asks, and then applies what skopt
does not know. While fewer than ``n_initial`` trials are told, skopt's ask is the next point of the
Latin hypercube it draws from the seed (no fit): that design is computed once per (space, seed) and
kept (``_initial_design``), as are the candidate grid and skopt's ``Space`` per space, all pure
functions of their keys; a decision of the initial design then builds no ``Optimizer`` at all.

- The initial design starts at the top: after the baseline, the deployed knobs with prefix caching
  on at the highest memory fraction of the range (one level lower if that fails), then the
  Latin hypercube. More KV memory is the first-order knob for prefix caching, and the optimum sits at
  or just below the highest fraction that survives the load, a corner that space-filling samples
  rarely (``_top_probe``). A batch limit the baseline showed binding (``space.widened``: the
  widening added its values on the side the diagnosis points to) is probed at the far end of its
  values in that same trial: the diagnosis' remedy at full strength, a corner of its own.
- Infeasible trials (crash, OOM, not ready in time) are told as a penalty value worse than the
  worst feasible one, AND feed a feasibility model. OOM risk is monotone along every knob flagged
  ``oom_monotone`` (the memory fraction; a step token budget): an OOM at (f, b) makes every
  (f' >= f, b' >= b) infeasible for the same other knobs (a partial order; a feasible trial at
  (f, b) proves every (f' <= f, b' <= b) free of it) and caps P(feasible) at 0.3 above it with other
  knobs; a start-up OOM that means "too small" works the other way round along the memory fraction
  (see ``Feasibility``); other failures mark that exact config; a logistic classifier over the
  space (fraction, token budget on a log scale, one-hot knobs) estimates P(feasible) elsewhere.
  Candidates need P(feasible) >= 0.5, and a known-infeasible config (after normalize) is never
  suggested. Candidates are ranked by EI x P(feasible).
- Repeated points: an asked point that normalizes to an already-measured config (or lands within
  ``SAME_FRACTION`` of one) is replaced by the best unseen candidate by acquisition.
- Noise: the GP has a white-noise term, and EI is taken against the best posterior mean at a
  measured feasible point (plug-in EI), not the best raw window, which noise inflates.
- Convergence: after the initial design, when the largest EI x P(feasible) over the candidates is
  below ``convergence_ei`` of the best score, or no unseen feasible candidate is left.

Methods ``random`` and ``grid`` (vLLM auto_tune style: probe the highest memory fraction that
works, stepping down, then sweep the other knobs there) exist for the benchmark's comparison.
"""

from __future__ import annotations

import math
import random
import warnings
from collections.abc import Iterator, Sequence
from contextlib import contextmanager
from dataclasses import dataclass
from functools import lru_cache
from typing import Any

from prefixtune.engines.base import KnobConfig
from prefixtune.engines.knobs import MEMORY_KNOB, OOM_AXES, Knob, Value, memory_of
from prefixtune.tuning.space import SearchSpace, categorical_key

Key = tuple[Value, ...]  # the knobs other than some axes (``categorical_key``, ``Feasibility.key``)

SAME_FRACTION = 0.005  # memory fractions closer than this are the same config for deduplication
OOM_FAILURES = frozenset({"oom", "oom_startup", "oom_runtime"})
N_RANDOM_CANDIDATES = 250
N_GRID_FRACTIONS = 13
SKOPT_SAMPLE_POINTS = 500
# The GP's hyperparameters: L-BFGS from the kernel's start, then from this many random starts. skopt
# restarts twice; each restart costs as much as the fit, and on the bench's scenarios (bench tuner,
# four scenarios x 3 seeds) none changed which config a run ends on for the worse.
GP_RESTARTS = 0
LHS_ITERATIONS = 50  # maximin LHS: skopt's default 1000 iterations cost ~1 s per decision
CROSS_KNOB_OOM_CAP = 0.3  # P(feasible) ceiling above an OOM seen with other knobs (< 0.5: not suggested)


@dataclass(frozen=True)
class TrialResult:
    """A finished trial as the optimizer sees it. ``value`` None means infeasible."""

    config: KnobConfig
    value: float | None
    failure: str = ""  # for infeasible trials: oom | oom_startup | oom_runtime | crash | timeout


@dataclass(frozen=True)
class Suggestion:
    config: KnobConfig | None  # None when nothing is left to try
    reason: str
    acquisition: float | None = None  # EI x P(feasible), relative to the best score
    p_feasible: float = 1.0
    converged: bool = False


def seed_from(key: str, generation: int = 0) -> int:
    """A stable 31-bit seed from the resource identity and tuning generation (no Python hash())."""
    h = 2166136261
    for byte in f"{key}#{generation}".encode():
        h = ((h ^ byte) * 16777619) & 0xFFFFFFFF
    return h & 0x7FFFFFFF


Point = tuple[float, ...]  # a config's values along the OOM axes, in the axes' order
EPS = 1e-9


def _differs(q: Point, p: Point) -> bool:
    return any(abs(a - b) > EPS for a, b in zip(q, p, strict=True))


class Feasibility:
    """What the finished trials say about where configs fail.

    OOM risk is monotone along several axes at once (``OOM_AXES``: the memory fraction, and any knob
    flagged ``oom_monotone`` such as a step token budget whose activations must fit outside the KV
    pool), so the rules below hold in the partial order of those axes, among configs equal in every
    other knob (the feasibility key). With one axis they are intervals of the memory fraction.

    Memory failures are directional. Too LARGE a demand leaves too little memory outside the KV pool
    (runtime OOM under load; SGLang's start-up OOM at 0.98 or with a chunk its reserve cannot hold):
    an OOM at (f, b) fails every (f' >= f, b' >= b) too, and a feasible (f, b) proves every
    (f' <= f, b' <= b) free of that failure. Too SMALL a pool cannot hold the weights or one sequence
    (start-up OOM): a failure at (f, b) fails every (f' <= f, b' >= b) too (a larger budget only takes
    more memory from the pool), and a feasible (f, b) proves every (f' >= f, b' <= b) free of it. A
    config is proven feasible when both hold. A runtime OOM is always "too large"; a start-up OOM's
    direction comes from the evidence (a feasible trial, any knobs, at or above it in the order: too
    small; with a pool no larger: too large) or, without evidence, from where its memory fraction lies
    (bottom / top quarter of the range); otherwise only that exact config is marked.
    The classifier's features: each continuous dimension scaled to [0, 4], a log-scale axis (a token
    budget) likewise on its logarithm, other knobs one-hot. A log-scale value <= 0 (the engine's own
    default, or no limit) is a size unknown here: it is ordered only against the same value, so
    configs that all keep the engine's default budget are ordered by memory alone.
    """

    def __init__(
        self, space: SearchSpace, history: Sequence[TrialResult], axes: Sequence[Knob] = OOM_AXES
    ) -> None:
        names = [k.name for k in axes]
        if MEMORY_KNOB.name not in names:
            raise ValueError(f"the OOM axes must include {MEMORY_KNOB.name}; got: {', '.join(names)}")
        self.space = space
        self.axes = tuple(axes)
        self._names = frozenset(names)
        self._m = names.index(MEMORY_KNOB.name)
        self._log = tuple(k.log_scale for k in self.axes)
        self._keys: dict[KnobConfig, Key] = {}  # key's answers
        self.too_large: dict[Key, list[Point]] = {}  # an OOM here fails everything above it
        self.too_small: dict[Key, list[Point]] = {}  # a pool too small here: smaller pools fail
        self.ok: dict[Key, list[Point]] = {}
        self.exact: set[KnobConfig] = set()
        self.any_large: list[Point] = []  # "too large" failures with any other knobs
        self.any_small: list[Point] = []  # "too small" failures with any other knobs
        fdim = space.dimension(MEMORY_KNOB.name)
        low, high = (fdim.low, fdim.high) if fdim is not None else (0.0, 1.0)
        assert low is not None and high is not None
        ok_points = [self.point(space.normalize(t.config)) for t in history if t.value is not None]
        xs: list[list[float]] = []
        ys: list[int] = []
        for t in history:
            cfg = space.normalize(t.config)
            key = self.key(cfg)
            p = self.point(cfg)
            f = memory_of(cfg)
            if t.value is None:
                self.exact.add(cfg)
                direction = ""
                if t.failure in ("oom", "oom_runtime"):
                    direction = "large"
                elif t.failure == "oom_startup":
                    above = any(self._above(o, p) and _differs(o, p) for o in ok_points)
                    below = any(self._smaller_pool(o, p) and _differs(o, p) for o in ok_points)
                    if above != below:
                        direction = "small" if above else "large"
                    elif not above and f <= low + 0.25 * (high - low):
                        direction = "small"
                    elif not above and f >= high - 0.25 * (high - low):
                        direction = "large"
                if direction == "large":
                    self.too_large.setdefault(key, []).append(p)
                    self.any_large.append(p)
                elif direction == "small":
                    self.too_small.setdefault(key, []).append(p)
                    self.any_small.append(p)
            else:
                self.ok.setdefault(key, []).append(p)
            if space.contains(cfg):
                xs.append(self._features(cfg))
                ys.append(0 if t.value is None else 1)
        self._known: dict[KnobConfig, bool] = {}  # known_infeasible's answers
        self._clf: Any = None
        if len(set(ys)) == 2:
            from sklearn.linear_model import LogisticRegression

            clf = LogisticRegression(C=10.0)
            clf.fit(xs, ys)
            self._clf = clf

    def point(self, cfg: KnobConfig) -> Point:
        """``cfg``'s values along the OOM axes."""
        return tuple(float(cfg.get(k.name)) for k in self.axes)

    def _ge(self, i: int, a: float, b: float) -> bool:
        """``a >= b`` on axis ``i``. A log-scale value <= 0 is a sentinel (the engine's own default,
        no limit) whose size is unknown here: it compares equal to itself and to nothing else."""
        if self._log[i] and (a <= 0 or b <= 0):
            return a == b
        return a >= b - EPS

    def _above(self, q: Point, p: Point) -> bool:
        """``q`` asks at least as much memory as ``p`` on every OOM axis (``q >= p`` componentwise)."""
        return all(self._ge(i, a, b) for i, (a, b) in enumerate(zip(q, p, strict=True)))

    def key(self, cfg: KnobConfig) -> Key:
        """The knobs other than the OOM axes: configs with the same key differ only along them."""
        found = self._keys.get(cfg)
        if found is None:  # each of a decision's candidates is keyed several times
            found = self._keys[cfg] = tuple(k.coerce(v) for k, v in cfg.items() if k.name not in self._names)
        return found

    def _smaller_pool(self, q: Point, p: Point) -> bool:
        """``q``'s KV pool is no larger than ``p``'s: no more memory, and no less of every other
        axis (each takes memory from the pool)."""
        return all(
            self._ge(i, b, a) if i == self._m else self._ge(i, a, b)
            for i, (a, b) in enumerate(zip(q, p, strict=True))
        )

    def _features(self, cfg: KnobConfig) -> list[float]:
        data = cfg.to_dict()
        out: list[float] = []
        for d in self.space.dims:
            axis = next((k for k in self.axes if k.name == d.name), None)
            if d.continuous:
                assert d.low is not None and d.high is not None
                out.append((float(data[d.name]) - d.low) / max(d.high - d.low, 1e-9) * 4.0)
            elif axis is not None and axis.log_scale:
                # a size on its logarithm; the sentinels (<= 0: the engine's default, SGLang's -1 for
                # no chunking) are not sizes on that scale, so each gets a one-hot feature of its own
                sizes = [float(c) for c in d.choices if float(c) > 0]
                value = float(data[d.name])
                if sizes:
                    lo, hi = math.log(min(sizes)), math.log(max(sizes))
                    scaled = (math.log(value) - lo) / max(hi - lo, 1e-9) * 4.0 if value > 0 else 0.0
                    out.append(scaled)
                out.extend(1.0 if data[d.name] == c else 0.0 for c in d.choices if float(c) <= 0)
            else:
                out.extend(1.0 if data[d.name] == c else 0.0 for c in d.choices)
        return out

    def known_infeasible(self, cfg: KnobConfig) -> bool:
        """Whether ``cfg`` is known to fail (memoized: a decision asks it of every candidate twice,
        and the answer depends only on the history this model was built from)."""
        known = self._known.get(cfg)
        if known is None:
            known = self._known[cfg] = self._infeasible(cfg)
        return known

    def _infeasible(self, cfg: KnobConfig) -> bool:
        cfg = self.space.normalize(cfg)
        if cfg in self.exact or _measured(cfg, list(self.exact)):
            return True
        key, q = self.key(cfg), self.point(cfg)
        return any(self._above(q, p) for p in self.too_large.get(key, ())) or any(
            self._smaller_pool(q, p) for p in self.too_small.get(key, ())
        )

    def _proven(self, cfg: KnobConfig) -> bool:
        """Below a feasible config in the order (not too large) and with a pool no smaller than a
        feasible one's (not too small), same other knobs."""
        ok, q = self.ok.get(self.key(cfg), []), self.point(cfg)
        return any(self._above(c, q) for c in ok) and any(self._smaller_pool(a, q) for a in ok)

    def p_feasible(self, cfgs: Sequence[KnobConfig]) -> list[float]:
        probs = [1.0] * len(cfgs)
        if self._clf is not None and cfgs:
            predicted = self._clf.predict_proba([self._features(c) for c in cfgs])[:, 1]
            probs = [float(p) for p in predicted]
        out: list[float] = []
        for cfg, p in zip(cfgs, probs, strict=True):
            q = self.point(cfg)
            if self.known_infeasible(cfg):
                out.append(0.0)
            elif self._proven(cfg):
                out.append(1.0)  # inside the region feasible trials with the same knobs span
            elif any(self._smaller_pool(q, s) for s in self.any_small):
                out.append(min(p, CROSS_KNOB_OOM_CAP))  # too small to start with other knobs too
            elif any(self._above(q, s) for s in self.any_large):
                # Memory, not the other knobs, decides OOM to first order: an OOM at a point with
                # other knobs keeps the points above it out of the suggestions until proven otherwise.
                out.append(min(p, CROSS_KNOB_OOM_CAP))
            else:
                out.append(p)
        return out


def _measured(cfg: KnobConfig, seen: Sequence[KnobConfig]) -> bool:
    key = categorical_key(cfg)
    return any(categorical_key(s) == key and abs(memory_of(s) - memory_of(cfg)) < SAME_FRACTION for s in seen)


class _Measured:
    """``_measured`` against one fixed list, indexed by categorical key: each of the hundreds of
    candidates of a decision is checked against the configs of its own key only (scanning the whole
    history per candidate was a fifth of a decision's time at 50 trials)."""

    def __init__(self, seen: Sequence[KnobConfig]) -> None:
        self._fractions: dict[Key, list[float]] = {}
        for s in seen:
            self._fractions.setdefault(categorical_key(s), []).append(memory_of(s))

    def __contains__(self, cfg: KnobConfig) -> bool:
        f = memory_of(cfg)
        return any(abs(g - f) < SAME_FRACTION for g in self._fractions.get(categorical_key(cfg), ()))


def _candidates(space: SearchSpace, seed: int, first: Sequence[KnobConfig] = ()) -> list[KnobConfig]:
    out: dict[KnobConfig, None] = dict.fromkeys(first)
    for cfg in _grid(space):
        out.setdefault(cfg, None)
    for point in _skopt_space(space).rvs(n_samples=N_RANDOM_CANDIDATES, random_state=seed):
        out.setdefault(space.to_config(point), None)
    return list(out)


# What a decision derives from the space alone, kept per space: a fleet has a few spaces (one per
# engine and spec.tuning.space), and every decision of every resource with that space reads them.
CACHED_SPACES = 64
# The initial design of each (resource, epoch): five configs, reread by each of its decisions.
CACHED_DESIGNS = 4096


@lru_cache(maxsize=CACHED_SPACES)
def _grid(space: SearchSpace) -> tuple[KnobConfig, ...]:
    return tuple(space.candidate_grid(N_GRID_FRACTIONS))


@lru_cache(maxsize=CACHED_SPACES)
def _skopt_space(space: SearchSpace) -> Any:
    """skopt's ``Space`` of ``space``, only ever sampled (``rvs`` reads it): building its dimensions
    (a scipy distribution each) cost more than the sampling."""
    from skopt.space import Space

    return Space(space.to_skopt())


@lru_cache(maxsize=1)
def _blas_controller() -> Any:
    """threadpoolctl's view of the loaded BLAS and OpenMP libraries, found once (``threadpool_limits``
    looks them up again on every call: ~5 ms each, a tenth of a decision in the initial design)."""
    import numpy  # noqa: F401  (its BLAS, and scipy's and sklearn's, loaded before the lookup)
    import scipy.linalg  # noqa: F401
    import sklearn  # noqa: F401
    from threadpoolctl import ThreadpoolController

    return ThreadpoolController()


@contextmanager
def _one_thread() -> Iterator[None]:
    """Tiny matrices: BLAS threads only contend (and 1 thread keeps the fit bit-for-bit repeatable)."""
    with _blas_controller().limit(limits=1):
        yield


def suggest(
    space: SearchSpace,
    history: Sequence[TrialResult],
    seed: int,
    *,
    method: str = "bo",
    n_initial: int = 5,
    convergence_ei: float = 0.01,
) -> Suggestion:
    """The next config to try given every finished trial (deterministic for a given seed)."""
    if space.empty:
        return Suggestion(None, "nothing to tune: no knob with more than one allowed value", converged=True)
    if method == "random":
        return _suggest_random(space, history, seed)
    if method == "grid":
        return _suggest_grid(space, history)
    if method != "bo":
        raise ValueError(f"method: {method!r} is not allowed; allowed: bo, random, grid")
    return _suggest_bo(space, history, seed, n_initial, convergence_ei)


def _optimizer(space: SearchSpace, seed: int, n_initial: int) -> Any:
    """skopt's ``Optimizer`` with its default GP (``cook_estimator("GP")``: constant x Matern 5/2
    with a length scale per dimension, plus white noise), drawn from the seed's random stream in
    the order ``Optimizer(base_estimator="GP")`` draws it, with ``GP_RESTARTS`` restarts."""
    import numpy as np
    from skopt import Optimizer
    from skopt.sampler import Lhs
    from skopt.utils import cook_estimator

    dimensions = space.to_skopt()
    rng = np.random.RandomState(seed)
    gp = cook_estimator("GP", space=dimensions, random_state=rng.randint(0, np.iinfo(np.int32).max))
    gp.set_params(n_restarts_optimizer=GP_RESTARTS)
    return Optimizer(
        dimensions,
        base_estimator=gp,
        acq_func="EI",
        acq_optimizer="sampling",
        acq_optimizer_kwargs={"n_points": SKOPT_SAMPLE_POINTS},
        n_initial_points=n_initial,
        initial_point_generator=Lhs(criterion="maximin", iterations=LHS_ITERATIONS),
        random_state=rng,
    )


@lru_cache(maxsize=CACHED_DESIGNS)
def _initial_design(space: SearchSpace, seed: int, n_initial: int) -> tuple[KnobConfig, ...]:
    """The Latin hypercube skopt's ``Optimizer`` draws at construction, as configs: what its ``ask``
    returns for the i-th point while fewer than ``n_initial`` trials are told (no fit before that)."""
    opt = _optimizer(space, seed, n_initial)
    return tuple(space.to_config(point) for point in opt._initial_samples)


def _fit(
    space: SearchSpace, history: Sequence[TrialResult], seed: int, n_initial: int
) -> tuple[Any, list[TrialResult]]:
    """skopt's Optimizer told every finished trial in the space (infeasible ones at a penalty), and
    those trials. Values are scaled by the largest one so that the GP sees O(1) numbers."""
    told = _told(space, history)
    feasible_values = [float(t.value) for t in told if t.value is not None]
    scale = max((abs(v) for v in feasible_values), default=1.0) or 1.0
    ys_ok = [-v / scale for v in feasible_values]
    penalty = max(ys_ok) + max(0.25, 0.5 * (max(ys_ok) - min(ys_ok))) if ys_ok else 1.0
    xs = [space.to_point(space.normalize(t.config)) for t in told]
    ys = [(-float(t.value) / scale if t.value is not None else penalty) for t in told]

    opt = _optimizer(space, seed, n_initial)
    with warnings.catch_warnings(), _one_thread():
        warnings.simplefilter("ignore")
        if xs:
            opt.tell(xs, ys)
    return opt, told


def _told(space: SearchSpace, history: Sequence[TrialResult]) -> list[TrialResult]:
    """The finished trials inside the space: what the surrogate is told."""
    return [t for t in history if space.contains(space.normalize(t.config))]


def _posterior_means(opt: Any, space: SearchSpace, configs: Sequence[KnobConfig]) -> list[float]:
    """The surrogate's mean at each config, in the fit's units (lower is better)."""
    points = [space.to_point(space.normalize(c)) for c in configs]
    with _one_thread():
        mu = opt.models[-1].predict(opt.space.transform(points))
    return [float(m) for m in mu]


def _suggest_bo(
    space: SearchSpace, history: Sequence[TrialResult], seed: int, n_initial: int, convergence_ei: float
) -> Suggestion:
    from skopt.acquisition import gaussian_ei

    feas = Feasibility(space, history)
    told = _told(space, history)
    opt: Any = None
    if len(told) >= n_initial:  # skopt fits its surrogate once n_initial trials are told
        opt, told = _fit(space, history, seed, n_initial)
        with warnings.catch_warnings(), _one_thread():
            warnings.simplefilter("ignore")
            asked = space.to_config(opt.ask())
    else:  # the initial design: skopt's ask is the next point of its Latin hypercube, no fit
        asked = _initial_design(space, seed, n_initial)[len(told)]
    feasible_values = [float(t.value) for t in told if t.value is not None]
    seen = _Measured([space.normalize(t.config) for t in history if t.value is not None])
    candidates = _candidates(space, seed, first=[asked])
    probs = feas.p_feasible(candidates)
    open_ = [(c, p) for c, p in zip(candidates, probs, strict=True) if p >= 0.5 and c not in seen]
    open_ = [(c, p) for c, p in open_ if not feas.known_infeasible(c)]
    if not open_:
        return Suggestion(None, "every candidate is measured or known infeasible", converged=True)

    if opt is None:  # still in the space-filling initial design
        probe = _top_probe(space, history, feas)
        if probe is not None:
            limits = "".join(f", {name} {probe.to_dict()[name]}" for name in space.widened)
            return Suggestion(
                probe,
                f"initial design ({len(told) + 1}/{n_initial}): the deployed knobs, caching on, at memory"
                f" fraction {memory_of(probe):g}, near the top of the range (KV memory is the"
                " first-order knob; a failed start there is cheap to learn from)"
                + (f"; the binding batch limits at the far end of their values{limits}" if limits else ""),
            )
        if any(c == asked for c, _ in open_):
            p = next(p for c, p in open_ if c == asked)
            return Suggestion(asked, f"initial design ({len(told) + 1}/{n_initial})", p_feasible=p)
        chosen, p = _farthest(space, open_, [space.normalize(t.config) for t in history])
        return Suggestion(chosen, f"initial design ({len(told) + 1}/{n_initial}), substitute", p_feasible=p)

    model = opt.models[-1]
    import numpy as np

    # Plug-in EI for noisy measurements: the incumbent is the best POSTERIOR MEAN at a measured
    # feasible point, not the best raw window. The raw best is biased by noise (the luckiest window
    # wins), which shrinks EI everywhere and stops the search early around a lucky trial.
    ok_configs = [t.config for t in told if t.value is not None]
    y_best = min(_posterior_means(opt, space, ok_configs)) if ok_configs else 1.0  # 1.0: the penalty
    transformed = opt.space.transform([space.to_point(c) for c, _ in open_])
    ei = np.asarray(gaussian_ei(transformed, model, y_opt=y_best, xi=0.01), dtype=float)
    acq = [float(e) * p for e, (_, p) in zip(ei.tolist(), open_, strict=True)]
    best_i = max(range(len(open_)), key=lambda i: (acq[i], -i))
    chosen, p = open_[best_i]
    relative = acq[best_i] / max(abs(y_best), 1e-12)
    # EI says little before the surrogate has seen enough feasible points: never stop that early.
    converged = relative < convergence_ei and len(feasible_values) >= n_initial + 1
    how = "asked point" if chosen == asked else "best unseen candidate by EI x P(feasible)"
    reason = f"GP/EI over {len(told)} trials: {how}, EI {relative:.3%} of best, P(feasible) {p:.2f}"
    if converged:
        reason = f"converged: max expected improvement {relative:.3%} of best < {convergence_ei:.1%}"
    return Suggestion(chosen, reason, acquisition=float(relative), p_feasible=float(p), converged=converged)


TOP_PROBE_STEPS = 2  # memory levels tried from the top (1/8 of the range apart) before giving up


def _top_probe(space: SearchSpace, history: Sequence[TrialResult], feas: Feasibility) -> KnobConfig | None:
    """The first trials after the baseline: the baseline's other knobs with prefix caching on (when
    the space allows it) at the top of the memory range, one level lower if that fails (vLLM's
    auto-tune starts the same way). A bigger KV pool is the knob that matters first for prefix
    caching, and the optimum sits at or just below the highest fraction that survives the load, a
    corner a space-filling design samples rarely. None once a probe level ran feasibly, every level
    failed, or there is no memory dimension."""
    fdim = space.dimension(MEMORY_KNOB.name)
    if fdim is None or not history:
        return None
    assert fdim.low is not None and fdim.high is not None
    base = history[0].config
    caching = space.dimension("prefix_caching")
    if caching is not None and True in caching.choices:
        base = base.with_(prefix_caching=True)  # the product's premise: the cache on, as big as it gets
    base = space.normalize(_far_limits(space, base))
    step = (fdim.high - fdim.low) / 8
    for i in range(TOP_PROBE_STEPS):
        cfg = space.normalize(base.with_(**{MEMORY_KNOB.name: fdim.high - i * step}))
        ran = [t for t in history if _measured(space.normalize(t.config), [cfg])]
        if any(t.value is not None for t in ran):
            return None  # this level works: the probe is done
        if not ran and not feas.known_infeasible(cfg):
            return cfg
    return None


def _far_limits(space: SearchSpace, base: KnobConfig) -> KnobConfig:
    """``base`` with each widened knob at the end of its values away from the baseline's value (the
    widening adds values on the side the diagnosis points to); unchanged where the baseline's value
    is inside them (both sides: no direction) or not one of them."""
    values = base.to_dict()
    moved: dict[str, Any] = {}
    for name in space.widened:
        d = space.dimension(name)
        if d is None or values.get(name) not in d.choices:
            continue
        ordered = sorted(d.choices)
        if values[name] == ordered[0]:
            moved[name] = ordered[-1]
        elif values[name] == ordered[-1]:
            moved[name] = ordered[0]
    return base.with_(**moved) if moved else base


def _distance(space: SearchSpace, a: KnobConfig, b: KnobConfig) -> float:
    da, db = a.to_dict(), b.to_dict()
    total = 0.0
    for d in space.dims:
        if d.continuous:
            assert d.low is not None and d.high is not None
            total += ((float(da[d.name]) - float(db[d.name])) / max(d.high - d.low, 1e-9)) ** 2
        else:
            total += 0.0 if da[d.name] == db[d.name] else 1.0
    return math.sqrt(total)


def _farthest(
    space: SearchSpace, open_: Sequence[tuple[KnobConfig, float]], seen: Sequence[KnobConfig]
) -> tuple[KnobConfig, float]:
    if not seen:
        return open_[0]
    return max(open_, key=lambda cp: min(_distance(space, cp[0], s) for s in seen))


def _suggest_random(space: SearchSpace, history: Sequence[TrialResult], seed: int) -> Suggestion:
    from skopt.space import Space

    seen = [space.normalize(t.config) for t in history]
    rng = random.Random(seed * 7919 + len(history))
    sky = Space(space.to_skopt())
    for _ in range(200):
        cfg = space.to_config(sky.rvs(n_samples=1, random_state=rng.randrange(2**31))[0])
        if not _measured(cfg, seen):
            return Suggestion(cfg, "random sample")
    return Suggestion(None, "random: no unseen config found", converged=True)


def _suggest_grid(space: SearchSpace, history: Sequence[TrialResult]) -> Suggestion:
    """vLLM auto_tune style: step the memory fraction down from the top until a config works,
    then sweep the other knobs' combinations at that fraction."""
    seen = [space.normalize(t.config) for t in history]
    levels = sorted(space.fraction_grid(9), reverse=True)
    base = space.base
    probed = [t for t in history if categorical_key(space.normalize(t.config)) == categorical_key(base)]
    feasible_level: float | None = None
    for level in levels:
        cfg = space.normalize(base.with_(**{MEMORY_KNOB.name: level}))
        result = next((t for t in probed if _measured(space.normalize(t.config), [cfg])), None)
        if result is None:
            return Suggestion(cfg, f"grid: probing memory fraction {level:g} (stepping down from the top)")
        if result.value is not None:
            feasible_level = level
            break
    if feasible_level is None:
        return Suggestion(None, "grid: no memory fraction works", converged=True)
    for combo in space.categorical_combos():
        cfg = space.normalize(combo.with_(**{MEMORY_KNOB.name: feasible_level}))
        if not _measured(cfg, seen):
            return Suggestion(cfg, f"grid: sweep at memory fraction {feasible_level:g}")
    return Suggestion(None, "grid: sweep finished", converged=True)
