"""The router's tree follows the KV pool of the pods it routes to: the stable pods' config."""

from __future__ import annotations

from prefixtune.api.validation import parse_spec
from prefixtune.controller.reconcile import stable_pool
from prefixtune.tuning.state import Trial

BASE = parse_spec({"engine": "sglang", "model": "m/x", "replicas": 2}).knob_config()


def _trial(i: int, kv: int | None, **knobs: object) -> Trial:
    return Trial(id=i, epoch=0, role="trial", config=BASE.with_(**knobs), started_at=float(i), kv_tokens=kv)


def test_the_pool_is_the_latest_one_reported_by_the_baselines_engine_knobs() -> None:
    trials = [
        _trial(1, 100_000),
        _trial(2, 50_000, memory_fraction=0.6),  # a canary on another fraction: not the stable pods'
        _trial(3, None),
        _trial(4, 120_000, routing_policy="round_robin"),  # a router-only trial: the same engines
        _trial(5, 60_000, memory_fraction=0.6),
    ]
    assert stable_pool(trials, BASE) == 120_000
    assert stable_pool(trials[:3], BASE) == 100_000
    assert stable_pool(trials[1:3], BASE) is None  # the router keeps its own default
