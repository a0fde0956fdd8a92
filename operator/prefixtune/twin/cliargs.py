"""Arguments shared by the twin's commands (run, serve, whatif): which engine, model and GPU, where
the requests come from, and (run, whatif) the replicas and their router. One definition, so the
commands accept and describe them alike."""

from __future__ import annotations

import argparse
from typing import TYPE_CHECKING

from prefixtune.twin.models import known

if TYPE_CHECKING:
    from prefixtune.twin.router import RoutingConfig


def add_target_args(p: argparse.ArgumentParser, *, model_required: bool, tp_default: int | None) -> None:
    """--engine, --model, --gpu, --tp."""
    p.add_argument("--engine", required=True, choices=[str(name) for name in known()])
    if model_required:
        p.add_argument("--model", required=True, help="model (HF name or short name)")
    else:
        p.add_argument(
            "--model", help="model (HF name or short name); optional when a full command follows --"
        )
    p.add_argument("--gpu", required=True, help="GPU type: H100-80GB, H200, A100-80GB (aliases accepted)")
    p.add_argument("--tp", type=int, default=tp_default, help="tensor parallel size (1..2)")


def add_workload_source(p: argparse.ArgumentParser) -> None:
    """Exactly one of --workload, --workload-file, --trace."""
    src = p.add_mutually_exclusive_group(required=True)
    src.add_argument("--workload", help="a workload preset name (rag, chatbot, agent, qa, gsp)")
    src.add_argument("--workload-file", help="a workload file (YAML/JSON)")
    src.add_argument("--trace", help="a Mooncake JSONL trace to replay")


def add_routing_args(p: argparse.ArgumentParser) -> None:
    """--replicas, --routing and the cache-aware router's settings (``twin/router.py``)."""
    from prefixtune.routing.policy import CacheAwareThresholds, Router, RoutingPolicy

    d = CacheAwareThresholds()
    g = p.add_argument_group("routing (several replicas behind a router)")
    g.add_argument("--replicas", type=int, default=1, help="engine replicas (default 1: no router)")
    g.add_argument(
        "--routing",
        choices=[str(x) for x in RoutingPolicy],
        default=str(RoutingPolicy.KUBE_PROXY),
        help="how requests are spread over the replicas (default kube-proxy: a plain Service, random)",
    )
    g.add_argument(
        "--cache-threshold", type=float, default=d.cache_threshold, help="cache_aware: least match ratio"
    )
    g.add_argument(
        "--balance-abs-threshold",
        type=int,
        default=d.balance_abs_threshold,
        help="cache_aware: in-flight spread (max - min) above which load balancing takes over",
    )
    g.add_argument(
        "--balance-rel-threshold",
        type=float,
        default=d.balance_rel_threshold,
        help="cache_aware: and max above this times min",
    )
    g.add_argument(
        "--max-tree-size", type=int, help="cache_aware: characters per replica's tree (default: the router's)"
    )
    g.add_argument(
        "--low-match",
        choices=[str(r) for r in Router],
        default=None,
        help="the router whose rule cache_aware follows below the threshold: sglang-router's smallest "
        "tree or vllm-router's least load (default: the router the operator renders for --engine)",
    )


def routing_config(ns: argparse.Namespace, policy: str | None = None) -> RoutingConfig:
    """The router the parsed arguments describe (``policy`` overrides --routing); ValueError if bad."""
    from prefixtune.engines.base import EngineName
    from prefixtune.routing.policy import CacheAwareThresholds, Router, RoutingPolicy
    from prefixtune.routing.settings import ENGINE_ROUTER
    from prefixtune.twin.router import RoutingConfig

    if ns.replicas < 1:
        raise ValueError(f"--replicas must be >= 1; got {ns.replicas}")
    name = policy if policy is not None else ns.routing
    try:
        chosen = RoutingPolicy(name)
    except ValueError:
        raise ValueError(
            f"routing {name!r} is not a policy; choose from {', '.join(str(x) for x in RoutingPolicy)}"
        ) from None
    return RoutingConfig(
        policy=chosen,
        thresholds=CacheAwareThresholds(
            cache_threshold=ns.cache_threshold,
            balance_abs_threshold=ns.balance_abs_threshold,
            balance_rel_threshold=ns.balance_rel_threshold,
        ),
        low_match=Router(ns.low_match) if ns.low_match else ENGINE_ROUTER[EngineName(ns.engine)],
        max_tree_size=ns.max_tree_size,
    )
