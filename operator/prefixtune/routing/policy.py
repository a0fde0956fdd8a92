"""The routing policies and the two routers that implement them: one place for these facts.

Checked against the routers' own command-line parsers (``--help`` of the PyPI wheels
``sglang-router`` 0.3.2, ``sglang-router launch``, and ``vllm-router`` 0.1.17):

- both: ``--policy {random,round_robin,cache_aware,power_of_two,...}`` (default ``cache_aware``),
  ``--cache-threshold`` (0.3), ``--balance-abs-threshold`` (64), ``--balance-rel-threshold`` (1.5),
  ``--max-tree-size`` (sglang-router 67108864, vllm-router 33554432 characters per worker),
  ``--service-discovery --selector ... --service-discovery-namespace ...``, ``--prometheus-port``;
- only vllm-router: ``consistent_hash``, ``sticky_least_loaded`` and ``kv_aware`` (the last needs the
  engines' KV events, with ``--kv-event-block-size`` equal to the engine's block size);
- only sglang-router: ``manual`` (a routing key the client sends).

``RoutingPolicy.KUBE_PROXY`` is no router at all: the engine pods' Service spreads connections.
``AUTO_POLICY`` is no policy either: the resource asks the operator to choose one
(``prefixtune.routing.settings.resolve_policy``).
"""

from __future__ import annotations

from dataclasses import dataclass
from enum import StrEnum
from typing import Final

AUTO_POLICY: Final = "auto"  # spec.routing.policy's default: the operator chooses (routing.settings)


class RoutingPolicy(StrEnum):
    """How requests are spread over the engine replicas (values: the routers' ``--policy`` names)."""

    KUBE_PROXY = "kube-proxy"  # no router: the Service's random spread of connections
    RANDOM = "random"
    ROUND_ROBIN = "round_robin"
    POWER_OF_TWO = "power_of_two"
    CACHE_AWARE = "cache_aware"
    CONSISTENT_HASH = "consistent_hash"  # session affinity: a hash of the session key picks the worker


class Router(StrEnum):
    """The router binaries (the PyPI wheels' console scripts)."""

    SGLANG = "sglang-router"
    VLLM = "vllm-router"


_BOTH = frozenset(
    {RoutingPolicy.RANDOM, RoutingPolicy.ROUND_ROBIN, RoutingPolicy.POWER_OF_TWO, RoutingPolicy.CACHE_AWARE}
)
ROUTER_POLICIES: dict[Router, frozenset[RoutingPolicy]] = {
    Router.SGLANG: _BOTH,
    Router.VLLM: _BOTH | {RoutingPolicy.CONSISTENT_HASH},
}


class EngineNeed(StrEnum):
    """What a router asks of the engines behind it beyond the OpenAI API every engine serves."""

    # The request as the engine's token ids: ``POST /v1/completions/render`` (a list, one object per
    # prompt) and ``POST /v1/chat/completions/render`` (one object), each ``{"request_id",
    # "token_ids", ...}`` (vLLM's GenerateRequest).
    TOKEN_IDS = "token_ids"


# What each router needs of the engines, under any of its policies (a trial between a router's
# policies restarts only the router, so the engines serve the need whatever the policy).
# vllm-router 0.1.17 with ``--policy cache_aware`` posts every request to the render route of every
# worker and routes on the token ids it gets back; a worker that gives none counts
# ``vllm_router_prefix_routing_decisions_total{outcome="missing_tokens"}`` and the request is routed
# by load alone, with no prefix affinity at all (measured against the wheel). sglang-router 0.3.2
# routes on the request's text.
ROUTER_NEEDS: dict[Router, frozenset[EngineNeed]] = {
    Router.SGLANG: frozenset(),
    Router.VLLM: frozenset({EngineNeed.TOKEN_IDS}),
}
# What any router may need: an engine command is rendered without knowing which router
# (spec.routing.router) will front it, so a routed engine serves all of it.
ANY_ROUTER_NEEDS: frozenset[EngineNeed] = frozenset().union(*ROUTER_NEEDS.values())

# Policies that keep a session's requests on one worker (the worker whose tree matches its history,
# or the hash of its key) for as long as the load stays balanced: a canary pod added behind such a
# router takes whole sessions (cache_aware sends what matches no tree to the smallest tree: the new
# worker's, so new sessions; consistent_hash moves the sessions whose key now hashes to it), never
# alternate turns of one.
SESSION_AFFINE = frozenset({RoutingPolicy.CACHE_AWARE, RoutingPolicy.CONSISTENT_HASH})
# Policies whose split of requests over the workers is the router's decision (prefix match, session
# hash, load in flight), not an even (round_robin) or random (kube-proxy, random) spread: a worker's
# share there departs from 1/N by design, not by chance.
DECIDED_SPLIT = SESSION_AFFINE | {RoutingPolicy.POWER_OF_TWO}
# The rest ignore the request's text: a session's turns and each hot prefix land on any replica, so
# each replica caches only its share of a conversation (and every hot prefix once per replica).
PREFIX_BLIND: frozenset[RoutingPolicy] = frozenset(RoutingPolicy) - SESSION_AFFINE

# The wheels whose command lines this module was checked against (``--help``), and the images the
# operator renders by default: no public image of either router is pinned here, so these name images
# built from the wheel (``pip install sglang-router==0.3.2`` / ``vllm-router==0.1.17`` on the
# operator's own pinned Python base); spec.routing.image names another.
ROUTER_VERSION: dict[Router, str] = {Router.SGLANG: "0.3.2", Router.VLLM: "0.1.17"}
DEFAULT_ROUTER_IMAGE: dict[Router, str] = {
    router: f"ghcr.io/prefixtune/{router.value}:{version}" for router, version in ROUTER_VERSION.items()
}

# How each router is started (the wheels' console scripts) and where it listens: both default to
# --port 30000 and --prometheus-port 29000; vllm-router binds 127.0.0.1 by default (--host and
# --prometheus-host), so the operator always renders 0.0.0.0 for both.
ROUTER_COMMAND: dict[Router, tuple[str, ...]] = {
    Router.SGLANG: ("sglang-router", "launch"),
    Router.VLLM: ("vllm-router",),
}
ROUTER_PORT = 30000
ROUTER_METRICS_PORT = 29000

# The per-worker character budget of the approximate radix tree, each router's default.
DEFAULT_MAX_TREE_SIZE: dict[Router, int] = {Router.SGLANG: 67_108_864, Router.VLLM: 33_554_432}


@dataclass(frozen=True)
class CacheAwareThresholds:
    """The cache-aware policy's settings, with both routers' defaults.

    A request goes to the worker whose tree shares the longest prefix with its text when that match is
    more than ``cache_threshold`` of the text (the routers' ``match_rate > cache_threshold``); else
    to the worker with the smallest tree (sglang-router) or the least loaded (vllm-router). Whenever
    the load is imbalanced (``max - min > balance_abs_threshold`` and ``max > min *
    balance_rel_threshold``, in requests in flight) the least-loaded worker takes it instead.
    """

    cache_threshold: float = 0.3
    balance_abs_threshold: int = 64
    balance_rel_threshold: float = 1.5

    def __post_init__(self) -> None:
        if not 0.0 <= self.cache_threshold <= 1.0:
            raise ValueError(f"cache threshold must be in [0, 1], got {self.cache_threshold}")
        if self.balance_abs_threshold < 0:
            raise ValueError(f"balance abs threshold must be >= 0, got {self.balance_abs_threshold}")
        if self.balance_rel_threshold < 1.0:
            raise ValueError(f"balance rel threshold must be >= 1, got {self.balance_rel_threshold}")
