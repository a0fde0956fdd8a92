"""A model of the routers' decisions: which replica each request goes to. Pure and deterministic.

``RouterModel(RoutingConfig(...), replicas, seed)`` decides per request with ``route(request, loads,
now) -> Routed``; ``loads`` are the requests in flight per replica as the router counts them (sent,
not yet finished). ``twin/replicas.py`` drives it inside its event loop, so queueing and
routing interact.

The policies (``RoutingPolicy``), as the routers decide them:

- ``kube-proxy``: no router; a Service spreads *connections* at random. Modelled as random per
  request (a client that opens a connection per request; a pooled client's connections make it
  coarser, never better for the cache).
- ``random``: a uniform draw per request. ``round_robin``: replicas in turn.
- ``power_of_two``: two distinct replicas drawn at random, the one with fewer requests in flight
  (sglang-router polls the engines' loads every ``load_check_interval_secs``; the model reads the
  router's own in-flight count, which that poll approximates).
- ``consistent_hash``: a hash of the session key picks the replica, so a session's turns stay
  together (vllm-router; a request without a session hashes its id). A hash ring differs from this
  modulo only when replicas come and go, which the twin does not model.
- ``cache_aware``: an approximate radix tree of the request text per replica (``ApproxTree``), as in
  ``sgl-router/src/policies/cache_aware.rs`` and ``tree.rs`` (sgl-project/sglang, the crate the
  sglang-router wheel is built from, read at commits 026f853b and 4d40eec0; which wheel version
  those commits shipped in was not checked) and ``src/policies/cache_aware.rs`` of
  vllm-project/router (commit 16917f49):

  1. the load is imbalanced when ``max - min > balance_abs_threshold`` *and*
     ``max > min * balance_rel_threshold`` (requests in flight): the least-loaded replica takes it;
  2. else the match ratio is the longest prefix any replica's tree shares with the text over the
     text's length; strictly above ``cache_threshold`` (the source's ``match_rate >
     cache_threshold``) the replica holding that prefix takes it; among several that hold it,
     sglang-router takes the first tenant of the deepest node in its ``DashMap`` (arbitrary but
     fixed per node): the model draws one per prefix from the seed, fixed for that prefix;
  3. else (a low match) sglang-router takes the replica with the *smallest tree*; vllm-router's
     current source takes the *least-loaded* one (``low_match_min_load``): ``low_match`` says which;
  4. the text is inserted into the chosen replica's tree (in the imbalanced case too);
  5. every ``eviction_interval_s`` (``eviction_interval_secs``, sglang-router: 120) each tree larger
     than ``max_tree_size`` loses least-recently-used leaves until it fits (sglang-router's
     ``evict_tenant_by_size``: per tenant).

  The twin's requests carry prefix identities, not text (``twin/prompt.py``): the tree's unit is a
  token, and ``max_tree_size`` (characters in the routers) is read as ``max_tree_size //
  CHARS_PER_TOKEN`` tokens (4 characters a token, the figure sgl-model-gateway's token-based
  policies use). The routers' defaults (tens of millions of characters) never evict in a benchmark
  of minutes; a small ``max_tree_size`` shows what eviction does.

  vllm-router 0.1.17 matches token ids, which it asks every engine for (vLLM's render endpoints):
  with none (``RoutingConfig.tokens`` False) every request goes to the least-loaded replica,
  decision ``missing_tokens``, and no tree is kept.

Not modelled: vllm-router's session-key map in front of its tree (chat requests with a session
header), ``sticky_least_loaded`` and ``kv_aware``; worker health; the router's own latency.
"""

from __future__ import annotations

import hashlib
import heapq
import random
from collections.abc import Sequence
from dataclasses import dataclass, field
from enum import StrEnum
from typing import Final

from prefixtune.routing.policy import DEFAULT_MAX_TREE_SIZE, CacheAwareThresholds, Router, RoutingPolicy
from prefixtune.twin.prompt import TokenSeq
from prefixtune.twin.request import Request

CHARS_PER_TOKEN: Final = 4  # characters of text per token, to read max_tree_size in the twin's tokens
EVICTION_INTERVAL_S: Final = 120.0  # sglang-router's default eviction_interval_secs (its CLI and logs)


class Decision(StrEnum):
    """Why a request went where it did (cache_aware's labels are vllm-router's decision metric's)."""

    RANDOM = "random"
    ROUND_ROBIN = "round_robin"
    POWER_OF_TWO = "power_of_two"
    SESSION_HASH = "session_hash"
    CACHE_AFFINITY = "cache_affinity"  # the match ratio cleared the threshold
    SMALLEST_TREE = "smallest_tree"  # low match, sglang-router
    LOW_MATCH_MIN_LOAD = "low_match_min_load"  # low match, vllm-router
    LOAD_BALANCE = "load_balance"  # the load was imbalanced
    MISSING_TOKENS = "missing_tokens"  # vllm-router got no token ids from the engines: load alone


_LOAD_AWARE: Final = frozenset({RoutingPolicy.POWER_OF_TWO, RoutingPolicy.CACHE_AWARE})


@dataclass(frozen=True)
class RoutingConfig:
    """A router in front of the replicas: its policy, the cache-aware thresholds, its tree budget.

    ``low_match`` is the router whose low-match rule the model follows (``Decision``);
    ``max_tree_size`` is in characters, as the routers take it (default: that router's).
    ``tokens`` says whether the router sees what it matches: sglang-router matches the request's
    text, always there; vllm-router 0.1.17 matches token ids it asks every engine for
    (``/v1/completions/render``, served by vLLM only with ``--enable-scale-out``), and without them
    its cache_aware routes by load alone (its ``missing_tokens`` outcome; measured against the wheel,
    ``tests/routing/test_routing_real_router.py``).
    """

    policy: RoutingPolicy = RoutingPolicy.KUBE_PROXY
    thresholds: CacheAwareThresholds = field(default_factory=CacheAwareThresholds)
    low_match: Router = Router.SGLANG
    max_tree_size: int | None = None
    eviction_interval_s: float = EVICTION_INTERVAL_S
    tokens: bool = True

    def __post_init__(self) -> None:
        if self.max_tree_size is not None and self.max_tree_size < CHARS_PER_TOKEN:
            raise ValueError(
                f"max_tree_size must be >= {CHARS_PER_TOKEN} characters; got {self.max_tree_size}"
            )
        if not self.eviction_interval_s > 0:
            raise ValueError(f"eviction_interval_s must be > 0; got {self.eviction_interval_s}")

    @property
    def load_aware(self) -> bool:
        """The decision reads the replicas' loads (so the replicas must run in one clock)."""
        return self.policy in _LOAD_AWARE

    @property
    def tree_tokens(self) -> int:
        """The per-replica tree budget in the twin's tokens."""
        return self.max_tree_chars // CHARS_PER_TOKEN

    @property
    def max_tree_chars(self) -> int:
        """The per-replica tree budget in characters (the router's flag; default: that router's)."""
        return self.max_tree_size if self.max_tree_size is not None else DEFAULT_MAX_TREE_SIZE[self.low_match]

    def to_dict(self) -> dict[str, object]:
        t = self.thresholds
        return {
            "policy": str(self.policy),
            "cache_threshold": t.cache_threshold,
            "balance_abs_threshold": t.balance_abs_threshold,
            "balance_rel_threshold": t.balance_rel_threshold,
            "low_match": str(self.low_match),
            "max_tree_size": self.max_tree_chars,
            "eviction_interval_s": self.eviction_interval_s,
            "tokens": self.tokens,
        }


class _Node:
    __slots__ = ("children", "last", "length", "parent")

    def __init__(self, parent: _Node | None, length: int, last: float) -> None:
        self.children: dict[int, _Node] = {}
        self.parent = parent
        self.length = length  # tokens of its segment this node holds
        self.last = last  # last access (simulated seconds)


class ApproxTree:
    """One replica's approximate radix tree of request texts (prefix identities, one node a segment).

    ``match(seq)`` is the number of leading tokens of ``seq`` the tree holds; ``insert(seq, now)``
    adds it (refreshing the path's access time); ``size`` is the tokens held; ``evict(budget)`` drops
    least-recently-used leaves until ``size <= budget``.
    """

    def __init__(self) -> None:
        self.root = _Node(None, 0, 0.0)
        self.size = 0

    def match(self, seq: TokenSeq) -> int:
        node, matched = self.root, 0
        for seg in seq.segments:
            child = node.children.get(seg.key)
            if child is None:
                break
            held = min(seg.length, child.length)
            matched += held
            if held < seg.length or child.length != seg.length:
                break  # the tree's text ends or turns within this segment
            node = child
        return matched

    def insert(self, seq: TokenSeq, now: float) -> None:
        node = self.root
        node.last = now
        for seg in seq.segments:
            child = node.children.get(seg.key)
            if child is None:
                child = node.children[seg.key] = _Node(node, seg.length, now)
                self.size += seg.length
            else:
                if seg.length > child.length:
                    self.size += seg.length - child.length
                    child.length = seg.length
                child.last = now
            node = child

    def evict(self, budget: int) -> int:
        """Drop LRU leaves (a parent becomes a leaf when its last child goes) until within ``budget``;
        returns the tokens dropped."""
        if self.size <= budget:
            return 0
        heap: list[tuple[float, int, _Node, int]] = []
        stack = [(self.root, 0)]
        while stack:
            node, key = stack.pop()
            if node.children:
                stack.extend((c, k) for k, c in node.children.items())
            elif node is not self.root:
                heap.append((node.last, id(node), node, key))
        heapq.heapify(heap)
        dropped = 0
        while self.size > budget and heap:
            _, _, node, key = heapq.heappop(heap)
            parent = node.parent
            assert parent is not None
            del parent.children[key]
            self.size -= node.length
            dropped += node.length
            if not parent.children and parent is not self.root:
                grand = parent.parent
                assert grand is not None
                pkey = next(k for k, c in grand.children.items() if c is parent)
                heapq.heappush(heap, (parent.last, id(parent), parent, pkey))
        return dropped


@dataclass(frozen=True)
class Routed:
    """One decision: the replica, why, and (cache_aware) the best match ratio it saw."""

    replica: int
    decision: Decision
    match_ratio: float = 0.0


def imbalanced(loads: Sequence[int], thresholds: CacheAwareThresholds) -> bool:
    """The routers' rule: ``max - min > balance_abs_threshold`` and ``max > min * balance_rel_threshold``."""
    hi, lo = max(loads), min(loads)
    return hi - lo > thresholds.balance_abs_threshold and hi > lo * thresholds.balance_rel_threshold


def _least(loads: Sequence[int]) -> int:
    return min(range(len(loads)), key=lambda i: (loads[i], i))


def _stable_hash(*parts: object) -> int:
    h = hashlib.blake2b(digest_size=8)
    for p in parts:
        h.update(str(p).encode())
        h.update(b"\x00")
    return int.from_bytes(h.digest(), "little")


class RouterModel:
    """The router in front of ``replicas`` replicas: ``route`` decides and records (trees, counts)."""

    def __init__(self, config: RoutingConfig, replicas: int, seed: int = 0) -> None:
        if replicas < 1:
            raise ValueError(f"replicas must be >= 1; got {replicas}")
        self.config = config
        self.replicas = replicas
        self.seed = int(seed)
        self._rng = random.Random(_stable_hash("router", seed, config.policy))
        self._next = 0
        self.trees = [ApproxTree() for _ in range(replicas)]
        self._evict_at = config.eviction_interval_s
        self.sent = [0] * replicas
        self.decisions: dict[Decision, int] = {}
        self.evicted_tokens = 0

    def route(self, req: Request, loads: Sequence[int], now: float) -> Routed:
        if len(loads) != self.replicas:
            raise ValueError(f"loads has {len(loads)} entries for {self.replicas} replicas")
        routed = self._decide(req, loads, now)
        self.sent[routed.replica] += 1
        self.decisions[routed.decision] = self.decisions.get(routed.decision, 0) + 1
        return routed

    def _decide(self, req: Request, loads: Sequence[int], now: float) -> Routed:
        policy, n = self.config.policy, self.replicas
        if policy in (RoutingPolicy.KUBE_PROXY, RoutingPolicy.RANDOM):
            return Routed(self._rng.randrange(n), Decision.RANDOM)
        if policy is RoutingPolicy.ROUND_ROBIN:
            i, self._next = self._next, (self._next + 1) % n
            return Routed(i, Decision.ROUND_ROBIN)
        if policy is RoutingPolicy.POWER_OF_TWO:
            if n == 1:
                return Routed(0, Decision.POWER_OF_TWO)
            a, b = self._rng.sample(range(n), 2)
            return Routed(a if (loads[a], a) <= (loads[b], b) else b, Decision.POWER_OF_TWO)
        if policy is RoutingPolicy.CONSISTENT_HASH:
            key = f"session:{req.session}" if req.session is not None else f"request:{req.req_id}"
            return Routed(_stable_hash(self.seed, key) % n, Decision.SESSION_HASH)
        return self._cache_aware(req, loads, now)

    def _cache_aware(self, req: Request, loads: Sequence[int], now: float) -> Routed:
        cfg = self.config
        if now >= self._evict_at:  # the routers' periodic eviction thread
            budget = cfg.tree_tokens
            self.evicted_tokens += sum(t.evict(budget) for t in self.trees)
            self._evict_at = now + cfg.eviction_interval_s
        text = req.prompt
        ratio = 0.0
        if not cfg.tokens and cfg.low_match is Router.VLLM:
            return Routed(_least(loads), Decision.MISSING_TOKENS)  # nothing to match: no tree either
        if imbalanced(loads, cfg.thresholds):
            chosen, decision = _least(loads), Decision.LOAD_BALANCE
        else:
            matches = [t.match(text) for t in self.trees]
            best = max(matches)
            ratio = best / text.length
            if ratio > cfg.thresholds.cache_threshold:
                holders = [i for i, m in enumerate(matches) if m == best]
                # sglang-router: the first tenant of the deepest matched node, fixed for that node
                pick = _stable_hash(self.seed, *text.prefix_id(best)) % len(holders)
                chosen, decision = holders[pick], Decision.CACHE_AFFINITY
            elif cfg.low_match is Router.VLLM:
                chosen, decision = _least(loads), Decision.LOW_MATCH_MIN_LOAD
            else:
                sizes = [t.size for t in self.trees]
                chosen = min(range(self.replicas), key=lambda i: (sizes[i], i))
                decision = Decision.SMALLEST_TREE
        self.trees[chosen].insert(text, now)
        return Routed(chosen, decision, ratio)

    def share(self) -> list[float]:
        """The router's request share per replica."""
        total = sum(self.sent)
        return [s / total if total else 0.0 for s in self.sent]


__all__ = [
    "CHARS_PER_TOKEN",
    "EVICTION_INTERVAL_S",
    "ApproxTree",
    "Decision",
    "Routed",
    "RouterModel",
    "RoutingConfig",
    "imbalanced",
]
