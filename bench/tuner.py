"""``prefixtune bench tuner``: the REAL tuning policy driven against the digital twin in virtual time.

For each scenario (bench/scenarios/*.yaml, format in docs/scenarios.md) and each method:

- ``bo``: the operator's policy with its Bayesian optimizer (what runs in the cluster);
- ``random``: the same policy with random suggestions;
- ``grid``: the same policy with vLLM-auto_tune-style suggestions (probe the highest memory
  fraction that works, stepping down, then sweep the other knobs there);
- ``default``: the engine's default config (measured only; the other methods start from the
  scenario's ``config``, the deployed config, which is the engine default unless the scenario says).

Every trial boots a twin from the adapter's rendered flags, warms up, and measures a window with its
own arrival randomness (seeded per trial: noisy as in production; the methods see the same sequence
of seeds). Reported per method: the TRUE score of the config the policy ends on (a long twin run)
over the oracle's (the best of an exhaustive grid over the discretized space, cached on disk), the
trials needed for the incumbent to reach 95% / 98% of the oracle (the baseline is trial 1; the
incumbent's true score is read from the oracle grid, interpolated linearly in memory fraction
between grid points of the same other knobs), infeasible trials, SLO-violating trials, wall time.
"""

from __future__ import annotations

import argparse
import hashlib
import json
import statistics
import sys
import time
from collections.abc import Sequence
from dataclasses import asdict, dataclass, field, replace
from pathlib import Path
from typing import Any

import yaml

from prefixtune.engines import get_adapter
from prefixtune.engines.base import Hardware, KnobConfig
from prefixtune.metrics.twin_signals import signals_from_summary
from prefixtune.tuning.drive import DriveResult, TrialRun, drive
from prefixtune.tuning.objective import SCORING, Score, higher_is_better_ratio, score
from prefixtune.tuning.settings import Slo, SpaceOverride, TuningSettings
from prefixtune.tuning.space import SearchSpace, build_space
from prefixtune.tuning.widening import reach, running_cap
from prefixtune.twin.capacity import CapacityModel, WorkloadSample, predict_capacity
from prefixtune.twin.catalog import find_gpu, no_twin_model

HERE = Path(__file__).resolve().parent
SCENARIO_DIR = HERE / "scenarios"
# Controls: scenarios where every config of the space scores within CONTROL_SPREAD of the others, so
# the right decision is to keep the deployed config; not part of the named suite (suite()).
CONTROL_DIR = SCENARIO_DIR / "controls"
CONTROL_SPREAD = 1.01  # "every config within 1%": best / worst true score over the oracle grid
CONTROL_KEEP = 0.95  # a control passes when at least this fraction of seeds ends on the deployed config
LIGHT_RATIO = 0.95  # the light-load suite passes when bo's median full-load ratio is at least this
SUITE_RATIO = 0.97  # and the named suite keeps bo's median at least this (issue 20's target)


@dataclass(frozen=True)
class TrialWindows:
    """The warm-up and measurement window of the policy's trials, when not the scenario's own
    (``Scenario.warmup_s`` / ``measure_s``). Only the trials: a true score stays a long run after the
    scenario's warm-up (its cache is keyed by the scenario), so both timings compare one truth."""

    warmup_s: float
    measure_s: float
    source: str  # where the timings come from, as the JSON setup records it

    @classmethod
    def production(cls) -> TrialWindows:
        """The operator's spec defaults (``TuningSettings``: spec.tuning.trial.warmup / measure)."""
        defaults = TuningSettings()
        return cls(
            warmup_s=defaults.warmup_s,
            measure_s=defaults.measure_s,
            source="production: the operator's spec defaults (TuningSettings warmup_s, measure_s)",
        )


@dataclass(frozen=True)
class Trials:
    """How a method's trials run and what the result keeps of them."""

    windows: TrialWindows | None = None  # None: the scenario's warmup_s / measure_s
    trace: bool = False  # keep every trial of every seed (``trial_trace``) in the result
    # the twin calibrated to each trial window predicts the config's capacity (``twin/capacity.py``),
    # which the headroom then counts; None: not predicted (the operator does not predict it yet)
    capacity: CapacityModel | None = None

    def warmup_s(self, scenario: Scenario) -> float:
        return scenario.warmup_s if self.windows is None else self.windows.warmup_s

    def measure_s(self, scenario: Scenario) -> float:
        return scenario.measure_s if self.windows is None else self.windows.measure_s


# A scenario's sustainable load is its ``rate``: the suite sizes each scenario at a load its best
# config sustains within the SLOs (docs/scenarios.md); ``--load-fraction F`` tunes at F x rate.
SUSTAINABLE = "the scenario's rate (each is sized at a load its oracle config sustains within the SLOs)"
METHODS = ("bo", "random", "grid", "default")
ORACLE_SEED = 424242
SCENARIO_KEYS = {
    "name", "description", "engine", "model", "gpu", "workload", "rate", "bound", "objective", "slo",
    "config", "space", "warmup_s", "measure_s", "eval_s", "eval_seeds", "min_requests", "oracle_fractions",
    "oracle_widen",
}  # fmt: skip


class ScenarioError(ValueError):
    pass


@dataclass(frozen=True)
class Scenario:
    name: str
    engine: str
    model: str
    gpu: str
    workload: Any  # preset name or an inline workload mapping
    rate: float
    description: str = ""
    bound: str = ""
    objective: str = "goodput"
    slo: Slo = field(default_factory=Slo)
    config: dict[str, Any] = field(default_factory=dict)
    space: SpaceOverride = field(default_factory=SpaceOverride)
    warmup_s: float = 60.0
    measure_s: float = 120.0
    eval_s: float = 480.0
    min_requests: int = 100
    oracle_fractions: int = 7
    eval_seeds: int = 1  # arrival seeds averaged into a true score (near a capacity cliff one is not enough)
    # batch-limit knobs whose every value the policy's widening could reach the oracle grid covers
    oracle_widen: tuple[str, ...] = ()
    control: bool = False  # read from bench/scenarios/controls/ (where it lies, not a YAML field)

    def hardware(self) -> Hardware:
        gpu = find_gpu(self.gpu)
        if gpu is None:
            raise ScenarioError(f"gpu: {no_twin_model(self.gpu)}")
        return Hardware(gpu.name, float(gpu.memory_bytes))

    def default_config(self) -> KnobConfig:
        """The engine's own default on the scenario's GPU (its batch limits filled in: the policy's
        widening reads them), as the API fills an omitted spec.config."""
        adapter = get_adapter(self.engine)
        return adapter.normalize(adapter.default_config_for(self.hardware()))

    def start_config(self) -> KnobConfig:
        """The deployed config: ``config`` over the engine's default on the scenario's GPU; a knob
        whose default follows another one (SGLang's memory fraction on the chunk) follows the
        scenario's value."""
        adapter = get_adapter(self.engine)
        cfg = adapter.default_config_for(self.hardware(), self.config)
        problems = adapter.validate(cfg)
        if problems:
            raise ScenarioError(f"{self.name}: config: " + "; ".join(f"{k}: {m}" for k, m in problems))
        return adapter.normalize(cfg)

    def search_space(self) -> SearchSpace:
        adapter = get_adapter(self.engine)
        return build_space(adapter.knobs(), self.start_config(), adapter.normalize, self.space)

    def widening_reach(self) -> dict[str, tuple[int, ...]]:
        """Every batch-limit value the policy's widening could add from the deployed config."""
        adapter = get_adapter(self.engine)
        deployed = self.start_config()
        return reach(
            adapter.knobs(), deployed, self.space, smaller_budget=adapter.budget_cuts_itl,
            refused=lambda changes: bool(adapter.cross_check(deployed.with_(**changes))),
        )  # fmt: skip

    def oracle_space(self) -> SearchSpace:
        """The space the oracle grid covers: the search space, and for each ``oracle_widen`` knob every
        value the policy's widening could add from the deployed config (``widening.reach``), so the
        oracle is the best of everything a method could end on."""
        adapter = get_adapter(self.engine)
        reachable = self.widening_reach()
        extra = {name: reachable[name] for name in self.oracle_widen if name in reachable}
        return build_space(adapter.knobs(), self.start_config(), adapter.normalize, self.space, extra)

    @property
    def workload_type(self) -> str:
        """The workload type: the preset's name, or an inline workload's ``name`` up to its first
        '-' (``rag-corpus`` is a rag workload)."""
        if isinstance(self.workload, str):
            return self.workload
        return str(self.workload.get("name", "inline")).split("-")[0]

    def at_load(self, fraction: float) -> Scenario:
        """The scenario at ``fraction`` of its sustainable load (``SUSTAINABLE``: its rate)."""
        if not 0.0 < fraction <= 1.0:
            raise ScenarioError(f"load fraction {fraction:g}: must be in (0, 1]")
        return self if fraction == 1.0 else replace(self, rate=self.rate * fraction)

    def digest(self) -> str:
        """Identifies the true-score cache. ``eval_seeds`` is left out: the cache holds one value per
        (config, seed), and eval_seeds only says how many of them a true score averages; so is
        ``control`` (where the file lies changes no score)."""
        left_out = ("eval_seeds", "control")
        fields: dict[str, Any] = {k: v for k, v in self.__dict__.items() if k not in left_out}
        fields["scoring"] = SCORING  # the cache holds scores: a new definition is a new cache
        text = json.dumps(_jsonable(fields), sort_keys=True, default=str)
        return hashlib.sha256(text.encode()).hexdigest()[:16]


def _jsonable(value: Any) -> Any:
    if hasattr(value, "__dataclass_fields__"):
        return {k: _jsonable(getattr(value, k)) for k in value.__dataclass_fields__}
    if isinstance(value, dict):
        return {str(k): _jsonable(v) for k, v in value.items()}
    if isinstance(value, list | tuple):
        return [_jsonable(v) for v in value]
    return value


def parse_scenario(data: Any, source: str) -> Scenario:
    if not isinstance(data, dict):
        raise ScenarioError(f"{source}: a scenario is a mapping; got {type(data).__name__}")
    unknown = set(data) - SCENARIO_KEYS
    if unknown:
        raise ScenarioError(
            f"{source}: unknown field(s) {', '.join(sorted(unknown))}; "
            f"allowed: {', '.join(sorted(SCENARIO_KEYS))}"
        )
    for key in ("name", "engine", "model", "gpu", "workload", "rate"):
        if key not in data:
            raise ScenarioError(f"{source}: field {key!r} is required")
    try:
        get_adapter(str(data["engine"]))
    except ValueError as exc:
        raise ScenarioError(f"{source}: engine: {exc}") from None
    slo = data.get("slo") or {}
    space = data.get("space") or {}
    try:
        slo_obj = Slo(float(slo.get("ttft_p99_s", 2.0)), float(slo.get("itl_p99_s", 0.15)))
        space_obj = SpaceOverride.from_mapping(space)
        scenario = Scenario(
            name=str(data["name"]),
            engine=str(data["engine"]),
            model=str(data["model"]),
            gpu=str(data["gpu"]),
            workload=data["workload"],
            rate=float(data["rate"]),
            description=str(data.get("description", "")),
            bound=str(data.get("bound", "")),
            objective=str(data.get("objective", "goodput")),
            slo=slo_obj,
            config=dict(data.get("config") or {}),
            space=space_obj,
            warmup_s=float(data.get("warmup_s", 60.0)),
            measure_s=float(data.get("measure_s", 120.0)),
            eval_s=float(data.get("eval_s", 480.0)),
            min_requests=int(data.get("min_requests", 100)),
            oracle_fractions=int(data.get("oracle_fractions", 7)),
            eval_seeds=int(data.get("eval_seeds", 1)),
            oracle_widen=tuple(str(k) for k in data.get("oracle_widen") or ()),
        )
        if scenario.eval_seeds < 1:
            raise ScenarioError(f"eval_seeds: {scenario.eval_seeds}; must be >= 1")
        if scenario.objective not in ("goodput", "throughput", "ttft"):
            raise ScenarioError(f"objective: {scenario.objective!r}; allowed: goodput, throughput, ttft")
        scenario.search_space()  # validates the space override against the engine
        reachable = scenario.widening_reach()
        for name in scenario.oracle_widen:
            if name not in reachable:
                raise ScenarioError(
                    f"oracle_widen: {name!r} is not a batch limit the policy can widen from this config"
                    f" (widenable: {', '.join(reachable) or 'none'})"
                )
        _check_workload(scenario.workload)
    except ScenarioError as exc:
        raise ScenarioError(f"{source}: {exc}") from None
    except (TypeError, ValueError, KeyError, IndexError) as exc:
        raise ScenarioError(f"{source}: {exc}") from None
    return scenario


def _check_workload(workload: Any) -> None:
    from prefixtune.twin.workloads import WorkloadError, parse_workload, preset

    if isinstance(workload, dict):
        try:
            parse_workload(workload, source="workload")  # its messages start with "workload: "
        except WorkloadError as exc:
            raise ScenarioError(str(exc)) from None
        return
    if not isinstance(workload, str):
        raise ScenarioError(
            f"workload: a preset name or an inline workload mapping; got {type(workload).__name__}"
        )
    try:
        preset(workload)
    except WorkloadError as exc:
        raise ScenarioError(f"workload: {exc}") from None


def load_scenario_file(path: Path) -> Scenario:
    try:
        data = yaml.safe_load(path.read_text())
    except (OSError, yaml.YAMLError) as exc:
        raise ScenarioError(f"{path}: {exc}") from None
    scenario = parse_scenario(data, str(path))
    return replace(scenario, control=path.resolve().parent == CONTROL_DIR)


def _load_dir(directory: Path) -> dict[str, Scenario]:
    out: dict[str, Scenario] = {}
    for path in sorted(directory.glob("*.yaml")):
        s = load_scenario_file(path)
        out[s.name] = s
    return out


def suite() -> dict[str, Scenario]:
    """The named suite: bench/scenarios/*.yaml (the controls' folder is not part of it)."""
    return _load_dir(SCENARIO_DIR)


def controls() -> dict[str, Scenario]:
    """The control scenarios: bench/scenarios/controls/*.yaml."""
    return _load_dir(CONTROL_DIR)


# ------------------------------------------------------------------------------------------------
# The twin as the policy's environment


class TwinEnv:
    """Runs a config on the twin: warm-up, then a measurement window (one simulate call)."""

    probes_boot = False  # start-up OOM shows up as the trial's result, after the rollout

    def __init__(self, scenario: Scenario, capacity: CapacityModel | None = None) -> None:
        self.scenario = scenario
        self.adapter = get_adapter(scenario.engine)
        self.capacity = capacity
        self.sim_seconds = 0.0
        self.capacity_seconds = 0.0  # wall seconds spent predicting capacities
        self.workload = WorkloadSample()  # every trial window's arrivals (one workload: the scenario's)

    def run(self, config: KnobConfig, warmup_s: float, measure_s: float, seed: int) -> TrialRun:
        from prefixtune.twin.run import SimOptions, simulate
        from prefixtune.twin.summary import GoodputSlo
        from prefixtune.twin.workloads import generate, parse_workload

        sc = self.scenario
        problems = self.adapter.validate(config)
        if problems:
            # the policy's space holds only configs the engine takes (the widening checks every
            # combination); a refused one is a bug to see, not an OOM for the feasibility model to learn
            raise RuntimeError(f"{sc.name}: the policy proposed a config {sc.engine} refuses: {problems}")
        workload = sc.workload if isinstance(sc.workload, str) else parse_workload(sc.workload)
        horizon = warmup_s + measure_s
        requests = generate(workload, rate=sc.rate, duration_s=horizon, seed=seed % (2**31))
        cmd = self.adapter.render(sc.model, config)
        slo = GoodputSlo(ttft_s=sc.slo.ttft_p99_s, itl_s=sc.slo.itl_p99_s)
        run = SimOptions(seed=seed % (2**31), slo=slo, warmup_s=warmup_s, horizon_s=horizon, files=cmd.files)
        summary = simulate(sc.engine, cmd.argv, sc.gpu, requests, run)
        self.sim_seconds += horizon
        if summary.status != "ok":
            return TrialRun(summary.status)  # type: ignore[arg-type]
        arrived = sum(1 for r in requests if warmup_s <= r.arrival_s < horizon)
        signals = signals_from_summary(summary, measure_s)
        if self.capacity is not None and arrived:
            t0 = time.perf_counter()
            self.workload.add(requests, warmup_s, horizon)
            stats = self.workload.stats(summary.prefill_tokens_saved_fraction)
            multiple = predict_capacity(
                sc.engine, cmd.argv, sc.gpu, slo, stats, files=cmd.files, model=self.capacity
            )
            signals = replace(signals, capacity_multiple=multiple)
            self.capacity_seconds += time.perf_counter() - t0
        return TrialRun("ok", signals, offered_rps=arrived / measure_s)


# ------------------------------------------------------------------------------------------------
# Oracle and true scores (long runs, cached on disk)


class TrueScores:
    def __init__(self, scenario: Scenario, env: TwinEnv, cache_dir: Path) -> None:
        self.scenario = scenario
        self.env = env
        self.path = cache_dir / f"{scenario.name}-{scenario.digest()}.json"
        self.values: dict[str, float | None] = {}
        if self.path.exists():
            self.values = json.loads(self.path.read_text())

    @staticmethod
    def key(cfg: KnobConfig, seed_index: int = 0) -> str:
        k = json.dumps(cfg.to_dict(), sort_keys=True)
        return k if seed_index == 0 else f"{k}#seed{seed_index}"

    def known(self, cfg: KnobConfig) -> bool:
        return all(self.key(cfg, i) in self.values for i in range(self.scenario.eval_seeds))

    def get(self, cfg: KnobConfig) -> float | None:
        """The mean score over ``eval_seeds`` long runs (seeds ORACLE_SEED + i); None (infeasible)
        when any of them fails or gives no score."""
        sc = self.scenario
        values: list[float | None] = []
        for i in range(sc.eval_seeds):
            k = self.key(cfg, i)
            if k not in self.values:
                run = self.env.run(cfg, sc.warmup_s, sc.eval_s, ORACLE_SEED + i)
                value: float | None = None
                if run.status == "ok" and run.signals is not None:
                    s = score(run.signals, sc.objective, sc.slo, 1)  # type: ignore[arg-type]
                    # the truth is the objective measured at the scenario's load, not the headroom
                    # the policy ranks by below saturation
                    value = s.measured_value if isinstance(s, Score) else None
                self.values[k] = value
                self.path.parent.mkdir(parents=True, exist_ok=True)
                self.path.write_text(json.dumps(self.values, indent=0, sort_keys=True))
            values.append(self.values[k])
        present = [v for v in values if v is not None]
        return None if len(present) < len(values) else float(statistics.fmean(present))

    def oracle(self, space: SearchSpace) -> tuple[KnobConfig, float]:
        best: tuple[KnobConfig, float] | None = None
        adapter = get_adapter(self.scenario.engine)
        for cfg in space.grid(self.scenario.oracle_fractions):
            if adapter.validate(cfg):
                continue  # a combination the engine refuses (vLLM: token budget below the running cap)
            v = self.get(cfg)
            if v is None:
                continue
            if best is None or higher_is_better_ratio(self.scenario.objective, v, best[1]) > 1.0:
                best = (cfg, v)
        if best is None:
            raise RuntimeError(f"{self.scenario.name}: no feasible config in the oracle grid")
        return best

    def spread(self, space: SearchSpace) -> dict[str, Any]:
        """How far apart the configs of the oracle grid score: ``spread`` is best over worst (as
        ``higher_is_better_ratio``), None when any config the engine takes is infeasible (a config
        that does not run is not "within 1%")."""
        adapter = get_adapter(self.scenario.engine)
        grid = [cfg for cfg in space.grid(self.scenario.oracle_fractions) if not adapter.validate(cfg)]
        scored = [self.get(cfg) for cfg in grid]
        values = [v for v in scored if v is not None]
        infeasible = len(scored) - len(values)
        out: dict[str, Any] = {"rate": self.scenario.rate, "configs": len(scored), "infeasible": infeasible}
        if not values:
            return {**out, "spread": None}
        objective = self.scenario.objective
        best = max(values, key=lambda v: higher_is_better_ratio(objective, v, values[0]))
        worst = min(values, key=lambda v: higher_is_better_ratio(objective, v, values[0]))
        ratio = higher_is_better_ratio(objective, best, worst)
        return {**out, "best": best, "worst": worst, "spread": None if infeasible else round(ratio, 5)}

    def interpolated(self, space: SearchSpace, cfg: KnobConfig) -> float | None:
        """The true score of ``cfg`` read from the oracle grid: linear in memory fraction between
        the two nearest grid fractions with the same other knobs (exact on grid points)."""
        levels = space.fraction_grid(self.scenario.oracle_fractions)
        f = float(cfg.memory_fraction)
        if self.known(cfg):
            return self.get(cfg)
        lower = max((lv for lv in levels if lv <= f), default=levels[0])
        upper = min((lv for lv in levels if lv >= f), default=levels[-1])
        vl = self.get(space.normalize(cfg.with_(memory_fraction=lower)))
        vu = self.get(space.normalize(cfg.with_(memory_fraction=upper)))
        if vl is None and vu is None:
            return None
        if vl is None or vu is None:
            return vl if vu is None else vu
        if upper == lower:
            return vl
        w = (f - lower) / (upper - lower)
        return vl + w * (vu - vl)


# ------------------------------------------------------------------------------------------------
# Running the methods


def settings_for(
    scenario: Scenario, method: str, budget: int, seed: int, trials: Trials = Trials()
) -> TuningSettings:
    """The policy's settings for one seed, its trials timed by ``trials``."""
    return TuningSettings(
        mode="auto",
        objective=scenario.objective,  # type: ignore[arg-type]
        slo=scenario.slo,
        space=scenario.space,
        warmup_s=trials.warmup_s(scenario),
        measure_s=trials.measure_s(scenario),
        min_requests=scenario.min_requests,
        max_trials=max(1, budget - 1),  # the baseline is trial 1 of the budget
        strategy="rolling",
        min_interval_s=0.0,
        method="bo" if method == "default" else method,  # type: ignore[arg-type]
        seed_key=f"bench/{scenario.name}/{seed}",
    )


def run_method(
    scenario: Scenario,
    method: str,
    seed: int,
    budget: int,
    truth: TrueScores,
    oracle: float,
    load_fraction: float = 1.0,
    trials: Trials = Trials(),
) -> dict[str, Any]:
    """One seed of one method: the policy tunes at ``load_fraction`` of the scenario's sustainable
    load, its trials run as ``trials`` says; the config it ends on is scored by ``truth`` (the
    scenario at full load, as the oracle)."""
    env = TwinEnv(scenario.at_load(load_fraction), trials.capacity)
    space = scenario.oracle_space()  # the incumbents' true scores are read from the oracle's grid
    t0 = time.perf_counter()
    if method == "default":
        settings = replace(settings_for(scenario, method, budget, seed, trials), max_trials=1)
        result = drive(
            scenario.engine, settings, scenario.default_config(), env, seed=seed,
            suggester=lambda *_: _stop(),
        )  # fmt: skip
    else:
        result = drive(scenario.engine, settings_for(scenario, method, budget, seed, trials),
                       scenario.start_config(), env, seed=seed)  # fmt: skip
    wall = time.perf_counter() - t0
    final = result.final_config
    final_true = truth.get(final)
    start = scenario.default_config() if method == "default" else scenario.start_config()
    ratio = 0.0 if final_true is None else _ratio(scenario.objective, final_true, oracle)
    to95, to98 = _trials_to(scenario, result, truth, space, oracle)
    infeasible = sum(1 for t in result.trials if t.outcome == "infeasible")
    violating = 0
    for t in result.trials:
        if t.signals is not None:
            s = score(t.signals, scenario.objective, scenario.slo, 1)  # type: ignore[arg-type]
            if isinstance(s, Score) and not s.slo_met:
                violating += 1
    out: dict[str, Any] = {
        "seed": seed,
        "ratio": round(ratio, 4),
        "final_config": final.to_dict(),
        "final_true_score": final_true,
        "ends_on_deployed": final.to_dict() == start.to_dict(),
        "trials": len(result.trials),
        "trials_to_95": to95,
        "trials_to_98": to98,
        "infeasible_trials": infeasible,
        "slo_violating_trials": violating,
        "phase": result.state.phase,
        "note": result.state.note,
        "wall_seconds": round(wall, 2),
        "sim_seconds": round(env.sim_seconds, 1),
    }
    if trials.capacity is not None:
        out["capacity_model_seconds"] = round(env.capacity_seconds, 1)
    if trials.trace:
        out["trials_trace"] = trial_trace(scenario, result, truth, oracle)
        out["gate"] = None if result.state.gate is None else result.state.gate.model_dump()
    return out


def trial_trace(
    scenario: Scenario, result: DriveResult, truth: TrueScores, oracle: float
) -> list[dict[str, Any]]:
    """Every trial of one seed as the policy saw it: its config, the window's value and score terms
    (measured objective, headroom factor and the budget that bounded it), requests, whether the
    significance gate asked for it, the trial's recorded reason (the score's terms once scored, the
    failure otherwise); and the config's true ratio at full load where the truth is known (the
    oracle grid's configs and the ends, no new long run)."""
    rows: list[dict[str, Any]] = []
    for t in result.trials:
        row: dict[str, Any] = {
            "id": t.id, "role": t.role, "gate_window": t.gate_window, "outcome": t.outcome,
            "failure": t.failure, "config": t.config.to_dict(), "value": t.value,
        }  # fmt: skip
        cap = running_cap(t.config)
        s = None if t.signals is None else score(t.signals, scenario.objective, scenario.slo, 1, cap)  # type: ignore[arg-type]
        if isinstance(s, Score):
            row["measured"] = s.measured_value
            row["headroom"] = None if s.headroom is None else s.headroom.factor
            row["headroom_limit"] = None if s.headroom is None else str(s.headroom.limit)
            row["requests"] = s.requests
            row["slo_met"] = s.slo_met
        known = truth.get(t.config) if truth.known(t.config) else None  # no new long run
        row["true_ratio"] = None if known is None else round(_ratio(scenario.objective, known, oracle), 4)
        row["reason"] = t.reason
        rows.append(row)
    return rows


def _stop() -> Any:
    from prefixtune.tuning.optimizer import Suggestion

    return Suggestion(None, "default config: no search", converged=True)


def _ratio(objective: str, value: float, oracle: float) -> float:
    return float(higher_is_better_ratio(objective, value, oracle))


def _trials_to(
    scenario: Scenario, result: DriveResult, truth: TrueScores, space: SearchSpace, oracle: float
) -> tuple[int | None, int | None]:
    # The incumbent as the policy ranks it: the config with the best mean over its windows (a config
    # measured again to confirm it counts by its mean), the earliest on ties.
    values: dict[KnobConfig, list[float]] = {}
    best_cfg: KnobConfig | None = None
    hit95: int | None = None
    hit98: int | None = None
    for k, t in enumerate(result.trials, start=1):
        if t.outcome == "ok" and t.value is not None:
            values.setdefault(t.config, []).append(t.value)
            best_cfg = max(values, key=lambda c: sum(values[c]) / len(values[c]))
        if best_cfg is None:
            continue
        true = truth.interpolated(space, best_cfg)
        if true is None:
            continue
        r = _ratio(scenario.objective, true, oracle)
        if hit95 is None and r >= 0.95:
            hit95 = k
        if hit98 is None and r >= 0.98:
            hit98 = k
    return hit95, hit98


def _median(values: Sequence[float | int | None]) -> float | None:
    present = [float(v) for v in values if v is not None]
    if len(present) < (len(values) + 1) // 2 or not present:
        return None  # never reached in most seeds
    # seeds that never reached it count as +inf: the median is then over the ordered list
    ordered = sorted(present) + [float("inf")] * (len(values) - len(present))
    m = statistics.median(ordered)
    return None if m == float("inf") else float(m)


def run_scenario(
    scenario: Scenario,
    methods: Sequence[str],
    seeds: int,
    budget: int,
    cache_dir: Path,
    log: Any,
    load_fraction: float = 1.0,
    trials: Trials = Trials(),
) -> dict[str, Any]:
    """Every method on ``seeds`` seeds, tuning at ``load_fraction`` of the scenario's sustainable
    load (the trials run as ``trials`` says) and scored at full load against the full-load oracle;
    a control also reports the spread of its grid's true scores at the load it was tuned at and at
    full load."""
    env = TwinEnv(scenario)
    truth = TrueScores(scenario, env, cache_dir)
    space = scenario.oracle_space()
    t0 = time.perf_counter()
    oracle_cfg, oracle = truth.oracle(space)
    oracle_wall = time.perf_counter() - t0
    print(f"[{scenario.name}] oracle {oracle:.4g} at {oracle_cfg.to_dict()} ({oracle_wall:.0f}s)", file=log)
    deployed = scenario.start_config()
    deployed_true = truth.get(deployed)
    deployed_ratio = 0.0 if deployed_true is None else _ratio(scenario.objective, deployed_true, oracle)
    out: dict[str, Any] = {
        "engine": scenario.engine,
        "model": scenario.model,
        "gpu": scenario.gpu,
        "description": scenario.description,
        "workload": scenario.workload if isinstance(scenario.workload, str) else "inline",
        "workload_type": scenario.workload_type,
        "rate": scenario.rate,
        "load_fraction": load_fraction,
        "tuned_rate": round(scenario.at_load(load_fraction).rate, 6),
        "trial_warmup_s": trials.warmup_s(scenario),
        "trial_measure_s": trials.measure_s(scenario),
        "control": scenario.control,
        "bound": scenario.bound,
        "objective": scenario.objective,
        "space_size": len(space.grid(scenario.oracle_fractions)),
        "oracle": {
            "config": oracle_cfg.to_dict(),
            "score": oracle,
            "grid_wall_seconds": round(oracle_wall, 1),
        },
        # the config the methods start from (their trial 1); the engine default is the default method
        "deployed": {
            "config": deployed.to_dict(),
            "true_score": deployed_true,
            "ratio": round(deployed_ratio, 4),
        },
        "methods": {},
    }
    if scenario.control:
        tuned = scenario.at_load(load_fraction)
        out["spread"] = {
            "tuned_load": TrueScores(tuned, TwinEnv(tuned), cache_dir).spread(space),
            "full_load": truth.spread(space),
        }
        print(f"[{scenario.name}] spread {out['spread']}", file=log)
    for method in methods:
        per_seed = [
            run_method(scenario, method, seed, budget, truth, oracle, load_fraction, trials)
            for seed in range(seeds)
        ]
        summary = {
            "median_ratio": round(float(statistics.median(p["ratio"] for p in per_seed)), 4),
            "ends_on_deployed_fraction": round(statistics.fmean(p["ends_on_deployed"] for p in per_seed), 4),
            "median_trials_to_95": _median([p["trials_to_95"] for p in per_seed]),
            "median_trials_to_98": _median([p["trials_to_98"] for p in per_seed]),
            "infeasible_trials": sum(p["infeasible_trials"] for p in per_seed),
            "slo_violating_trials": sum(p["slo_violating_trials"] for p in per_seed),
            "wall_seconds": round(sum(p["wall_seconds"] for p in per_seed), 1),
            "per_seed": per_seed,
        }
        out["methods"][method] = summary
        print(
            f"[{scenario.name}] {method}: ratio {summary['median_ratio']},"
            f" to95 {summary['median_trials_to_95']},"
            f" to98 {summary['median_trials_to_98']}, infeasible {summary['infeasible_trials']},"
            f" on deployed {summary['ends_on_deployed_fraction']},"
            f" wall {summary['wall_seconds']}s",
            file=log,
        )
    return out


Job = tuple[Scenario, Sequence[str], int, int, Path, float, Trials]


def _run_one(job: Job) -> tuple[str, dict[str, Any]]:
    scenario, methods, seeds, budget, cache_dir, load_fraction, trials = job
    return scenario.name, run_scenario(
        scenario, methods, seeds, budget, cache_dir, sys.stderr, load_fraction, trials
    )


def run_scenarios(
    scenarios: Sequence[Scenario],
    methods: Sequence[str],
    seeds: int,
    budget: int,
    cache_dir: Path,
    jobs: int,
    load_fraction: float = 1.0,
    control_seeds: int | None = None,
    trials: Trials = Trials(),
) -> list[tuple[str, dict[str, Any]]]:
    """Every scenario, in order; with ``jobs`` > 1 in forked worker processes (one scenario each:
    a scenario's true-score cache file is only ever written by one process). Controls run
    ``control_seeds`` seeds (default ``seeds``); the trials run as ``trials`` says."""

    def n_seeds(sc: Scenario) -> int:
        return control_seeds if sc.control and control_seeds is not None else seeds

    work: list[Job] = [
        (sc, methods, n_seeds(sc), budget, cache_dir, load_fraction, trials) for sc in scenarios
    ]
    if jobs <= 1 or len(work) <= 1:
        return [_run_one(w) for w in work]
    import multiprocessing
    from concurrent.futures import ProcessPoolExecutor

    ctx = multiprocessing.get_context("fork")  # workers start from this process, imports done
    with ProcessPoolExecutor(max_workers=min(jobs, len(work)), mp_context=ctx) as pool:
        return list(pool.map(_run_one, work))


def checks(result: dict[str, Any]) -> dict[str, Any]:
    """The suite's targets: bo >= 0.95 of the oracle (at full load, wherever it tuned) in every
    scenario that is not a control (and >= 0.97, ``SUITE_RATIO``, as issue 20 asks of the named
    suite); bo reaches 95% in no more trials than random in at least 6 of 8
    scenarios (never-reached counts as worse than any number); how many scenarios discriminate at
    all (the engine default, or the deployed config the methods start from, <= 0.90 of the oracle);
    and for each control, that every config is within 1% at the load it was tuned at and bo ends on
    the deployed config in at least 95% of seeds."""
    scen = result["scenarios"]
    named = {n: s for n, s in scen.items() if not s.get("control", False)}
    bo_ok = {
        n: s["methods"]["bo"]["median_ratio"] >= LIGHT_RATIO for n, s in named.items() if "bo" in s["methods"]
    }
    bo_97 = {
        n: s["methods"]["bo"]["median_ratio"] >= SUITE_RATIO for n, s in named.items() if "bo" in s["methods"]
    }
    not_worse = {}
    for n, s in named.items():
        m = s["methods"]
        if "bo" in m and "random" in m:
            b, r = m["bo"]["median_trials_to_95"], m["random"]["median_trials_to_95"]
            not_worse[n] = b is not None and (r is None or b <= r)
    # A scenario discriminates only when the engine default, or the deployed config the methods start
    # from, is clearly below the oracle.
    matters = {
        n: s["methods"]["default"]["median_ratio"] <= 0.90
        for n, s in named.items()
        if "default" in s["methods"]
    }
    deployed = {n: s["deployed"]["ratio"] <= 0.90 for n, s in named.items() if "deployed" in s}
    either = {n: matters.get(n, False) or deployed.get(n, False) for n in named}
    return {
        "default_ratio_le_0.90": matters,
        "default_ratio_le_0.90_count": sum(matters.values()),
        "deployed_ratio_le_0.90": deployed,
        "tuning_matters_count": sum(either.values()),
        "bo_ratio_ge_0.95": bo_ok,
        "bo_ratio_ge_0.95_all": all(bo_ok.values()) if bo_ok else None,
        "bo_ratio_ge_0.97": bo_97,
        "bo_ratio_ge_0.97_all": all(bo_97.values()) if bo_97 else None,
        "bo_trials_to_95_le_random": not_worse,
        "bo_not_worse_than_random_count": sum(not_worse.values()),
        **control_checks(scen),
    }


def control_checks(scenarios: dict[str, Any]) -> dict[str, Any]:
    """Per control: ``flat`` (best/worst over its grid <= CONTROL_SPREAD at the load it was tuned
    at, every config feasible), bo's fraction of seeds ending on the deployed config, and ``ok``
    (flat and that fraction >= CONTROL_KEEP)."""
    out: dict[str, dict[str, Any]] = {}
    for name, s in scenarios.items():
        if not s.get("control", False) or "bo" not in s["methods"]:
            continue
        spread = s["spread"]["tuned_load"]["spread"]
        flat = spread is not None and spread <= CONTROL_SPREAD
        kept = s["methods"]["bo"]["ends_on_deployed_fraction"]
        out[name] = {"spread": spread, "flat": flat, "ends_on_deployed_fraction": kept,
                     "ok": flat and kept >= CONTROL_KEEP}  # fmt: skip
    return {
        "controls": out,
        "controls_all_ok": all(c["ok"] for c in out.values()) if out else None,
    }


def decision_timing(n_trials: int = 50, repeats: int = 3) -> dict[str, Any]:
    """Wall time of one BO decision with ``n_trials`` of history (SGLang's full space: the largest)."""
    from prefixtune.tuning.optimizer import TrialResult, suggest

    adapter = get_adapter("sglang")
    space = build_space(adapter.knobs(), adapter.default_config(), adapter.normalize)
    grid = space.grid(9)
    history = []
    for i in range(n_trials):
        cfg = grid[(i * 37) % len(grid)]
        ok = cfg.memory_fraction < 0.93
        value = 1000.0 * (1.2 - (cfg.memory_fraction - 0.85) ** 2) * (1.3 if cfg.prefix_caching else 1.0)
        history.append(TrialResult(cfg, value if ok else None, "" if ok else "oom_runtime"))
    suggest(space, history, seed=1)  # imports and warm caches out of the measurement
    times = []
    for r in range(repeats):
        t0 = time.perf_counter()
        suggest(space, history, seed=2 + r)
        times.append(time.perf_counter() - t0)
    return {
        "trials": n_trials,
        "median_seconds": round(statistics.median(times), 3),
        "all": [round(t, 3) for t in times],
    }


def main(argv: list[str]) -> int:
    p = argparse.ArgumentParser(prog="prefixtune bench tuner", description=__doc__.split("\n")[0])
    which = p.add_mutually_exclusive_group()
    which.add_argument("--suite", action="store_true", help="every scenario in bench/scenarios/")
    which.add_argument(
        "--scenario", action="append", help="a scenario of the suite or a control by name (repeatable)"
    )
    which.add_argument("--scenario-file", type=Path, help="a scenario YAML file")
    p.add_argument(
        "--controls",
        action="store_true",
        help="also run the controls (bench/scenarios/controls/: every config within 1%%)",
    )
    p.add_argument(
        "--load-fraction",
        type=float,
        default=1.0,
        help="tune at this fraction of each scenario's sustainable load (its rate); the config a "
        "method ends on is still scored at full load against the full-load oracle",
    )
    p.add_argument("--control-seeds", type=int, help="seeds for the controls (default: --seeds)")
    p.add_argument(
        "--production-windows",
        action="store_true",
        help="time the trials as the operator's spec defaults do (warm-up and measurement window "
        "of spec.tuning.trial) instead of each scenario's warmup_s/measure_s; true scores unchanged",
    )
    p.add_argument(
        "--trace",
        action="store_true",
        help="keep every trial of every seed in the JSON (config, value, score terms, gate windows, "
        "the trial's recorded reason) and the gate's record",
    )
    p.add_argument(
        "--capacity-model",
        nargs="?",
        const="measured",
        choices=("measured", "poisson"),
        help="the twin, calibrated to the trial windows (arrival rate and dispersion, prompt and output "
        "length quantiles: pooled over the windows; the config's prefill saved), predicts each trial's "
        "capacity, which the headroom counts (twin/capacity.py; an experiment: the operator does not "
        "predict it). 'poisson': the synthetic arrivals are Poisson, not as bursty as measured",
    )
    p.add_argument("--seeds", type=int, default=5)
    p.add_argument("--budget", type=int, default=15, help="trials per run, baseline included")
    p.add_argument("--methods", default=",".join(METHODS), help=f"comma list of {', '.join(METHODS)}")
    p.add_argument("--cache-dir", type=Path, default=Path(".cache/prefixtune-bench/tuner"))
    p.add_argument("--json", action="store_true", help="print the JSON result (else a short table)")
    p.add_argument("--output", type=Path, help="also write the JSON result to this file")
    p.add_argument(
        "--jobs",
        type=int,
        default=1,
        help="scenarios run in parallel processes (results do not depend on it)",
    )
    args = p.parse_args(argv)
    methods = [m.strip() for m in args.methods.split(",") if m.strip()]
    bad = [m for m in methods if m not in METHODS]
    if bad:
        print(f"--methods: unknown {', '.join(bad)}; allowed: {', '.join(METHODS)}", file=sys.stderr)
        return 2
    bad_control_seeds = args.control_seeds is not None and args.control_seeds < 1
    if args.seeds < 1 or args.budget < 2 or args.jobs < 1 or bad_control_seeds:
        print("--seeds and --control-seeds must be >= 1, --budget >= 2 and --jobs >= 1", file=sys.stderr)
        return 2
    if not 0.0 < args.load_fraction <= 1.0:
        print(f"--load-fraction: {args.load_fraction:g}; must be in (0, 1]", file=sys.stderr)
        return 2
    if not (args.suite or args.scenario or args.scenario_file or args.controls):
        print("choose scenarios: --suite, --scenario NAME, --scenario-file F or --controls", file=sys.stderr)
        return 2
    try:
        scenarios: list[Scenario] = []
        if args.scenario_file is not None:
            scenarios = [load_scenario_file(args.scenario_file)]
        elif args.suite:
            scenarios = list(suite().values())
        elif args.scenario:
            all_ = {**suite(), **controls()}
            missing = [n for n in args.scenario if n not in all_]
            if missing:
                print(f"--scenario: unknown {', '.join(missing)}; known: {', '.join(all_)}", file=sys.stderr)
                return 2
            scenarios = [all_[n] for n in args.scenario]
        if args.controls:
            scenarios += [c for c in controls().values() if c not in scenarios]
    except ScenarioError as exc:
        print(f"prefixtune bench tuner: {exc}", file=sys.stderr)
        return 2
    windows = TrialWindows.production() if args.production_windows else None
    capacity = (
        None if args.capacity_model is None else CapacityModel(dispersion=args.capacity_model == "measured")
    )
    trials = Trials(windows, trace=args.trace, capacity=capacity)
    t0 = time.perf_counter()
    result: dict[str, Any] = {
        "setup": {
            "seeds": args.seeds,
            "control_seeds": args.seeds if args.control_seeds is None else args.control_seeds,
            "budget": args.budget,
            "load_fraction": args.load_fraction,
            "sustainable_load": SUSTAINABLE,
            "trial_windows": {"source": "each scenario's warmup_s, measure_s (bench/scenarios/*.yaml)"}
            if windows is None
            else {"source": windows.source, "warmup_s": windows.warmup_s, "measure_s": windows.measure_s},
            "ratio": "true score at FULL load of the config a method ends on, over the full-load oracle's",
            "control_spread_max": CONTROL_SPREAD,
            "control_keep_min": CONTROL_KEEP,
            "methods": methods,
            "capacity_model": None if capacity is None else asdict(capacity),
            "trial_count_includes_baseline": True,
            "true_score": "long twin run (eval_s) with a fixed seed; trials_to_X incumbents use the "
            "oracle grid interpolated in memory fraction",
            "python": sys.version.split()[0],
        },
        "scenarios": {},
    }
    result["setup"]["jobs"] = args.jobs
    runs = run_scenarios(
        scenarios, methods, args.seeds, args.budget, args.cache_dir, args.jobs,
        args.load_fraction, args.control_seeds, trials,
    )  # fmt: skip
    for name, res in runs:
        result["scenarios"][name] = res
    result["setup"]["wall_seconds"] = round(time.perf_counter() - t0, 1)
    result["setup"]["decision_50_trials"] = decision_timing()
    result["checks"] = checks(result)
    text = json.dumps(result, indent=2)
    if args.output is not None:
        args.output.write_text(text)
    if args.json:
        print(text)
    else:
        for name, s in result["scenarios"].items():
            row = ", ".join(
                f"{m} {v['median_ratio']:.3f}/{v['median_trials_to_95']}" for m, v in s["methods"].items()
            )
            print(f"{name}: {row}  (median ratio / trials to 95%)")
        print(json.dumps(result["checks"]))
    return 0
