"""Routing in the search: when the router's knobs enter the space, over which values, and how a
change of them is priced.

The router's knobs (``ROUTER_KNOBS``: the policy and the cache-aware thresholds) are in every
adapter's knob table, not searched by default (``prefixtune.engines._common.ROUTING_SPECS``). Here
they become searchable where a router can act on them (``routed_knobs``):

- With fewer than two replicas there is nothing to route between: never in the space, listed or
  not (a scale to one replica takes them out at the next decision; the base keeps their values).
- With two replicas or more, a spec that lists them in ``spec.tuning.space`` searches exactly the
  listed values (as for every knob), whatever the baseline's policy.
- Otherwise they are searched by default when the baseline runs a router (its policy is not
  kube-proxy): the policy over the policies the resource's router has (``ROUTER_POLICIES``), each
  threshold over a small ladder: the routers' default and its neighbours among the knob's own values
  (``ladder``; cache 0.1/0.3/0.5, balance abs 32/64/128, rel 1.25/1.5/2.0). A baseline on kube-proxy
  chose no router: nothing is searched unless listed.

The thresholds mean something only under ``cache_aware``: a conditional dimension. It is handled as
the adapters handle a cache-aware schedule with caching off: every other policy's configs are
collapsed onto one value of each threshold (``collapse``), so the grid and the optimizer's
candidates hold each of them once, and a trial of ``random`` is never repeated for thresholds it
does not read.

A trial that changes only router knobs restarts the router, not the engines (``Restarts`` of the
registry): no model load, no GPU to find, the engines' caches kept. Its price (``TrialPrice``) is
what the policy waits for: the router's start (``ROUTER_READY_TIMEOUT_S``) instead of the engines'
load, and a warm-up all the same, because the sessions the new router maps to other workers meet
caches that lack their history until one turn has passed. It runs on every pod (a router serves the
whole fleet, so there is no canary of a routing change; ``trial_strategy``). Under the canary
strategy an optimizer's suggestion that moves engine and router knobs at once runs its router part
first (``one_device``): whole, it would roll every engine pod.

``auto`` is resolved in the space as the operator renders it, from the resource's own config
(``resolved``): the search never holds ``auto``, and a trial never swaps the router for it.

An engine trial's canary behind a router: the canary pod joins the router's workers (service
discovery) with an empty tree. Under cache_aware a request goes to the worker whose tree matches
its text past the threshold, else to the smallest tree, the new canary's: the canary takes whole new
sessions, and their later turns match its tree and stay (consistent_hash likewise keeps a session on
the worker its key hashes to). Only the load balance moves a session's turn elsewhere. The slice is
consistent by session, and its size is the router's decision, far from 1/N: the paired score divides
by the requests each side served (``decided_split``, ``objective.paired``).
"""

from __future__ import annotations

from collections.abc import Callable, Mapping
from dataclasses import dataclass, replace

from prefixtune.engines.base import KnobConfig, KnobSpec
from prefixtune.engines.knobs import (
    BY_NAME,
    PREFIX_CACHING,
    ROUTER_KNOBS,
    ROUTING_POLICY,
    Restarts,
    Value,
    restarts_of,
)
from prefixtune.routing.policy import AUTO_POLICY, DECIDED_SPLIT, ROUTER_POLICIES, Router, RoutingPolicy
from prefixtune.routing.settings import resolve_policy
from prefixtune.tuning.settings import SpaceOverride, Strategy

MIN_ROUTED_REPLICAS = 2  # fewer replicas: nothing to route between
THRESHOLDS: tuple[str, ...] = tuple(k.name for k in ROUTER_KNOBS if k.name != ROUTING_POLICY)
# A router's pod starts in seconds (no weights to load): it is ready within this or the trial failed.
ROUTER_READY_TIMEOUT_S = 120.0


@dataclass(frozen=True)
class Routing:
    """What the search needs of the resource's routing: the router it runs (spec.routing's) and the
    engine replicas it spreads requests over."""

    router: Router
    replicas: int

    @property
    def possible(self) -> bool:
        """Whether there is anything to route between."""
        return self.replicas >= MIN_ROUTED_REPLICAS


def resolved(config: KnobConfig, replicas: int, spec: KnobConfig | None = None) -> KnobConfig:
    """``config`` with an ``auto`` policy resolved as the operator renders the spec's
    (``routing.settings.resolve_policy``: cache_aware with two replicas or more when the workload
    shares prefixes, read as prefix caching on in ``spec``, the resource's config; ``config`` itself
    when None), so that the search never holds ``auto`` and a spec's ``auto`` equals the policy it
    runs (no trial, no router restart, for the same thing). ``auto`` is the resource's choice, made
    once from its spec: a trial that turns prefix caching on does not bring a router with it."""
    if str(config.get(ROUTING_POLICY)) != AUTO_POLICY:
        return config
    shares = bool((spec or config).get(PREFIX_CACHING))
    policy = resolve_policy(AUTO_POLICY, replicas, shares)
    return config.with_(**{ROUTING_POLICY: policy.value})


def routes(config: KnobConfig, replicas: int) -> bool:
    """Whether ``config`` puts a router in front of the engines (``auto`` resolved)."""
    return str(resolved(config, replicas).get(ROUTING_POLICY)) != RoutingPolicy.KUBE_PROXY.value


def routed_knobs(
    knobs: Mapping[str, KnobSpec], base: KnobConfig, routing: Routing | None, override: SpaceOverride
) -> dict[str, KnobSpec]:
    """The adapter's knob table with the router's knobs as this resource searches them (the module
    docstring's rules); the engine knobs unchanged. ``routing`` None: no router is known (the offline
    benchmark's single engine): the table as the adapter has it (the router's knobs searched only
    where listed)."""
    if routing is None:
        return dict(knobs)
    table = {name: spec for name, spec in knobs.items() if BY_NAME[name].restarts is Restarts.ENGINE}
    if not routing.possible:
        return table
    by_default = routes(base, routing.replicas)
    for k in ROUTER_KNOBS:
        spec = knobs.get(k.name)
        if spec is None:
            continue
        if override.get(k.name) is not None or not by_default:
            table[k.name] = spec  # listed: build_space searches exactly the listed values
            continue
        if k.name == ROUTING_POLICY:
            choices: tuple[Value, ...] = tuple(
                p.value for p in RoutingPolicy if p in ROUTER_POLICIES[routing.router]
            )
        else:
            choices = ladder(spec)
        table[k.name] = replace(spec, choices=choices, searched=True)
    return table


def ladder(spec: KnobSpec) -> tuple[Value, ...]:
    """A threshold's values searched by default: the routers' default (the knob's ``unset``) and its
    neighbour on either side among the knob's own values (``ROUTING_SPECS``); three values each keep
    the routed space to 15 routing combinations per engine combination."""
    ordered = sorted(spec.choices)
    default = BY_NAME[spec.name].unset
    if default not in ordered:
        return tuple(ordered)
    i = ordered.index(default)
    return tuple(ordered[max(i - 1, 0) : i + 2])


def collapse(canonical: Mapping[str, Value]) -> Callable[[KnobConfig], KnobConfig]:
    """A normalizer that sets the thresholds to ``canonical`` wherever the policy is not
    ``cache_aware`` (the only policy that reads them)."""

    def normalize(config: KnobConfig) -> KnobConfig:
        if str(config.get(ROUTING_POLICY)) == RoutingPolicy.CACHE_AWARE.value:
            return config
        moved = {name: value for name, value in canonical.items() if config.get(name) != value}
        return config.with_(**moved) if moved else config

    return normalize


def canonical_thresholds(base: KnobConfig, choices: Mapping[str, tuple[Value, ...]]) -> dict[str, Value]:
    """The threshold values a non-cache-aware config is collapsed onto: the base's where the
    threshold is not searched (or its value is one of the searched ones), else the first searched
    value (every collapsed config must be a point of the space)."""
    out: dict[str, Value] = {}
    for name in THRESHOLDS:
        value = BY_NAME[name].coerce(base.get(name))
        searched = choices.get(name)
        out[name] = value if not searched or value in searched else searched[0]
    return out


def decided_split(router: Router | None, running: KnobConfig, replicas: int) -> bool:
    """Whether a router in front of the pods decides each one's share of the requests under the
    running config's policy (``DECIDED_SPLIT``: cache_aware, consistent_hash, power_of_two); a canary
    is then scored per request it served, by its actual share (``objective.paired``)."""
    if router is None:
        return False
    policy = str(resolved(running, replicas).get(ROUTING_POLICY))
    return policy in {p.value for p in DECIDED_SPLIT}


def restarts(running: KnobConfig, trial: KnobConfig) -> frozenset[Restarts]:
    """What moving the fleet from ``running`` to ``trial`` restarts (empty: nothing)."""
    return restarts_of(running, trial)


def router_only(running: KnobConfig, trial: KnobConfig) -> bool:
    """The change restarts the router and not the engines."""
    return restarts(running, trial) == frozenset({Restarts.ROUTER})


def trial_strategy(strategy: Strategy, running: KnobConfig, trial: KnobConfig) -> Strategy:
    """How a trial of ``trial`` beside ``running`` rolls out: a change of the router's knobs serves
    the whole fleet (one router in front of every pod: a canary pod cannot run another routing
    policy than its baseline), so it is a rolling trial, scored on every pod against the load the
    baseline saw; an engine-only change keeps the resource's strategy."""
    if Restarts.ROUTER in restarts(running, trial):
        return "rolling"
    return strategy


def one_device(strategy: Strategy, running: KnobConfig, suggested: KnobConfig) -> KnobConfig:
    """The trial to run for an optimizer's ``suggested`` config: under the canary strategy, a
    suggestion that changes the engines' knobs and the router's at once runs its router part first
    (``running``'s engine knobs with the suggested routing: a router-only trial, cheap, engines
    untouched). Run whole it would roll every engine pod at once, which the canary strategy (and a
    ``maxTrialReplicas`` cap, which runs as a canary) exists to avoid; its engine part is then a
    canary under that routing, if the optimizer still asks for it. Otherwise ``suggested``."""
    if strategy != "canary" or restarts(running, suggested) != {Restarts.ENGINE, Restarts.ROUTER}:
        return suggested
    return running.with_(**{k.name: suggested.get(k.name) for k in ROUTER_KNOBS})


@dataclass(frozen=True)
class TrialPrice:
    """What a trial costs the policy in waiting: the readiness it waits for, and whether the
    engines' caches start cold."""

    restarts: frozenset[Restarts]
    ready_timeout_s: float

    @property
    def engines_restart(self) -> bool:
        return Restarts.ENGINE in self.restarts

    def text(self) -> str:
        """For Events: what the rollout restarts."""
        if not self.restarts:
            return "restarts nothing"
        if not self.engines_restart:
            return "restarts the router only (engines and their caches kept, no model load)"
        if Restarts.ROUTER in self.restarts:
            return "restarts the engines and the router"
        return "restarts the engines"


def price(running: KnobConfig, trial: KnobConfig, engine_ready_timeout_s: float) -> TrialPrice:
    """The price of rolling ``trial`` out over ``running``: a router-only change waits for the
    router's start, never longer than the engines' budget."""
    what = restarts(running, trial)
    if Restarts.ENGINE in what or not what:
        return TrialPrice(what, engine_ready_timeout_s)
    return TrialPrice(what, min(ROUTER_READY_TIMEOUT_S, engine_ready_timeout_s))
