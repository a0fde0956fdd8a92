"""What one resource's router runs with: ``RoutingSettings``, resolved from spec.routing and the knobs.

spec.routing holds the baseline (policy, router, image, replicas, thresholds, tree size); the tuned
ones (the policy and the three cache-aware thresholds) are knobs (``prefixtune.engines.knobs``,
``ROUTER_KNOBS``) that a trial may change, restarting only the router. ``RoutingSettings`` is the
resolved value the router's objects render from: the policy is never ``auto`` here.

``auto`` picks ``cache_aware`` when the resource has two replicas or more and its workload shares
prefixes (``resolve_policy`` says what counts), else ``kube-proxy``: one replica needs no router.

The router by engine (``ENGINE_ROUTER``): SGLang and TensorRT-LLM behind sglang-router, vLLM behind
vllm-router. The two routers' cache_aware policies match different things, measured against the
wheels' binaries (``tests/routing/test_routing_real_router.py``):

- sglang-router 0.3.2 matches the request's text: it needs no more of a worker than the OpenAI API
  and ``/health`` (it probes SGLang's ``/server_info`` and ``/model_info`` once; a 404, or
  trtllm-serve's ``/server_info`` without SGLang's keys, only leaves them unknown), and sessions
  sharing a system prompt go to one worker and stay there.
- vllm-router 0.1.17 matches token ids that it asks every worker for before each decision (``POST
  /v1/completions/render``, ``/v1/chat/completions/render``: vLLM's scale-out endpoints). A worker
  that answers none (vLLM without ``--enable-scale-out``: 403; no such route: 404) makes every
  decision ``missing_tokens`` (``vllm_router_prefix_routing_decisions_total``) and the requests go
  by load alone: cache_aware is then cache-blind, a session's turns landing where chance puts them.

trtllm-serve serves no render endpoint in the image the operator runs (1.3.0rc24,
``engines/trtllm.py``): beside ``/v1/models``, ``/v1/completions``, ``/v1/chat/completions``,
``/health`` (200 when up, 503 when not), ``/metrics`` and ``/version`` it has RL, perf and
disaggregation routes and, in later builds, a ``/server_info`` of ``{"disaggregated_params": ...}``,
but no render route (``NVIDIA/TensorRT-LLM`` ``tensorrt_llm/serve/openai_server.py``
``register_routes``; the trtllm-serve docs of 1.3.0rc20, 1.3.0rc27 and 1.4.0rc1 list no render
endpoint either). 1.4.0rc4 adds ``/v1/completions/render`` and ``/v1/chat/completions/render`` as a
prototype mounted only with ``TRTLLM_ENABLE_RENDER_ENDPOINTS=1`` (``tensorrt_llm/serve/render/
api_router.py``), untried here with vllm-router. So TensorRT-LLM runs behind sglang-router, whose
text-based tree works with any OpenAI-API worker. It has no ``consistent_hash``: a TensorRT-LLM
resource that wants session affinity names ``spec.routing.router: vllm-router`` (the hash of a session
key needs no token ids); one that names the policy without that router is refused with the routers
that have it (``policy_problem``).
"""

from __future__ import annotations

from dataclasses import dataclass, replace

from prefixtune.engines.base import EngineName
from prefixtune.engines.knobs import (
    BALANCE_ABS_THRESHOLD,
    BALANCE_REL_THRESHOLD,
    CACHE_THRESHOLD,
    ROUTER_KNOBS,
    ROUTING_POLICY,
    KnobConfig,
)
from prefixtune.routing.policy import (
    AUTO_POLICY,
    DEFAULT_MAX_TREE_SIZE,
    ROUTER_POLICIES,
    CacheAwareThresholds,
    Router,
    RoutingPolicy,
)

# The policy ``auto`` picks where a router pays (replicas >= 2, shared prefixes).
AUTO_ROUTED = RoutingPolicy.CACHE_AWARE

# The router in front of each engine unless spec.routing.router names another (module docstring).
ENGINE_ROUTER: dict[EngineName, Router] = {
    EngineName.SGLANG: Router.SGLANG,
    EngineName.VLLM: Router.VLLM,
    EngineName.TRTLLM: Router.SGLANG,
}


def resolve_policy(requested: str, replicas: int, shares_prefixes: bool) -> RoutingPolicy:
    """The policy a resource runs: ``requested`` unless it is ``auto``.

    ``auto``: ``cache_aware`` with two replicas or more when the workload shares prefixes, else
    ``kube-proxy`` (one replica needs no router; with no shared prefixes a router's tree buys nothing
    over kube-proxy's spread). ``shares_prefixes`` is the caller's reading of the workload: prefix
    caching on in the config, or a measured prefix-cache hit rate above zero.
    """
    if requested != AUTO_POLICY:
        return RoutingPolicy(requested)
    if replicas >= 2 and shares_prefixes:
        return AUTO_ROUTED
    return RoutingPolicy.KUBE_PROXY


def policy_problem(policy: RoutingPolicy, router: Router) -> str | None:
    """None when ``router`` has ``policy`` (kube-proxy needs no router), else a message naming the
    policies it has and the routers that have this one (spec.routing.router may name one)."""
    if policy is RoutingPolicy.KUBE_PROXY or policy in ROUTER_POLICIES[router]:
        return None
    has = ", ".join(sorted(p.value for p in ROUTER_POLICIES[router]))
    others = " or ".join(r.value for r in Router if policy in ROUTER_POLICIES[r])
    return (
        f"{router.value} has no {policy.value} policy; it has {has} (or kube-proxy: no router); "
        f"{policy.value} needs routing.router {others}"
    )


@dataclass(frozen=True)
class RoutingSettings:
    """One resource's router, resolved: what its Deployment's container runs with.

    ``policy`` is never ``auto``; ``kube-proxy`` means no router (``routed`` is False). A policy the
    router lacks is refused here, so no value of this type renders one.
    """

    policy: RoutingPolicy
    router: Router
    image: str
    replicas: int = 1
    cache_threshold: float = CacheAwareThresholds.cache_threshold
    balance_abs_threshold: int = CacheAwareThresholds.balance_abs_threshold
    balance_rel_threshold: float = CacheAwareThresholds.balance_rel_threshold
    max_tree_size: int = 0  # 0: the router's own default (DEFAULT_MAX_TREE_SIZE)

    def __post_init__(self) -> None:
        problem = policy_problem(self.policy, self.router)
        if problem is not None:
            raise ValueError(problem)
        if not self.image:
            raise ValueError("routing: the router image must not be empty")
        if self.replicas < 1:
            raise ValueError(f"routing: replicas must be >= 1, got {self.replicas}")
        try:
            _ = self.thresholds  # built for the thresholds' own checks
        except ValueError as err:
            raise ValueError(f"routing: {err}") from None
        if self.max_tree_size < 0:
            raise ValueError(f"routing: max tree size must be >= 0, got {self.max_tree_size}")

    @property
    def routed(self) -> bool:
        """Whether a router runs in front of the engines (any policy but kube-proxy)."""
        return self.policy is not RoutingPolicy.KUBE_PROXY

    @property
    def tree_size(self) -> int:
        """The tree's per-worker character budget: the set one, else the router's default."""
        return self.max_tree_size or DEFAULT_MAX_TREE_SIZE[self.router]

    @property
    def thresholds(self) -> CacheAwareThresholds:
        return CacheAwareThresholds(
            self.cache_threshold, self.balance_abs_threshold, self.balance_rel_threshold
        )

    def knob_values(self) -> dict[str, object]:
        """The tuned settings by knob name (``ROUTER_KNOBS``), as a KnobConfig holds them."""
        return {
            ROUTING_POLICY: self.policy.value,
            CACHE_THRESHOLD: self.cache_threshold,
            BALANCE_ABS_THRESHOLD: self.balance_abs_threshold,
            BALANCE_REL_THRESHOLD: self.balance_rel_threshold,
        }

    def with_knobs(self, config: KnobConfig, engine_replicas: int, shares_prefixes: bool) -> RoutingSettings:
        """These settings with a config's routing knobs (the baseline's from spec.routing, or a
        trial's), the policy resolved (``auto``: by ``engine_replicas`` and ``shares_prefixes``).

        The knob config is where the tuned values live: every routing knob's value is taken from it.
        """
        values = {knob.name: knob.coerce(config.get(knob.name)) for knob in ROUTER_KNOBS}
        policy = resolve_policy(str(values.pop(ROUTING_POLICY)), engine_replicas, shares_prefixes)
        return replace(self, policy=policy, **values)  # type: ignore[arg-type]


# Every routing knob but the policy is a field of RoutingSettings by the same name.
if not {k.name for k in ROUTER_KNOBS} - {ROUTING_POLICY} <= set(RoutingSettings.__dataclass_fields__):
    raise TypeError("RoutingSettings must have a field for each routing knob")  # pragma: no cover
