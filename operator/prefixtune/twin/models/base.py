"""The contract between the twin and one engine's model, and the registry that picks one by name.

A ``TwinModel`` holds every engine fact the twin needs and nothing else does: the memory plan (how
the engine turns its memory fraction into a KV pool and an activation budget), scheduler traits
(default limits by GPU, batch limits resolved at boot, the limits and prompts it refuses, policy
names, whether prefill and decode mix, how a victim is chosen, the new-token reservation, the policy
that never evicts), the roofline's
per-step overheads, the KV cache model and its options, the engine's Prometheus series
(``metrics``: an ``EngineMetrics`` class, see ``twin/exporter.py``) and serving quirks (the error
body's shape, ``owned_by``, the start-up OOM message, extra HTTP routes).

Each engine's module (``vllm.py``, ``sglang.py``, ``trtllm.py``) defines one and registers it; the
rest of the twin asks ``twin_model(name)``, as Vidur picks its scheduler class from a registry
(``vidur/scheduler/replica_scheduler/replica_scheduler_registry.py``). Another engine is one module
with one ``register`` call (``tests/engines/test_engines_fourth.py`` adds one from the tests).
"""

from __future__ import annotations

import importlib
from collections.abc import Mapping
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any, ClassVar

if TYPE_CHECKING:
    from prefixtune.twin.cache.base import KVCache
    from prefixtune.twin.catalog import GpuHardware
    from prefixtune.twin.exporter import EngineMetrics
    from prefixtune.twin.memory import MemoryStart
    from prefixtune.twin.observer import Gauges

# The engines the twin ships a model for: ``prefixtune.twin.models.<name>`` registers itself.
BUILTIN = ("vllm", "sglang", "trtllm")
# The queue orders the twin's scheduler implements (``TwinEngine._ordered_waiting``).
TWIN_POLICIES = frozenset(
    {
        "fcfs",
        "priority",
        "guaranteed_no_evict",
        "max_utilization",
        "lpm",
        "hrrn",
        "lof",
        "random",
        "dfs-weight",
    }
)


@dataclass(frozen=True)
class SchedulerDefaults:
    """An engine's scheduler limits when its command sets none (they depend on the GPU)."""

    max_running: int  # 0: resolved from the pool at boot (``TwinModel.resolve_max_running``)
    max_batched_tokens: int
    chunked_prefill: bool


def adapter_defaults(engine: str, gpu: GpuHardware) -> SchedulerDefaults:
    """The batch limits the engine's adapter names for this GPU (``default_config_for``) and its
    chunked-prefill default (``chunked_prefill_default``): the facts live in ``prefixtune.engines``."""
    from prefixtune.engines import get_adapter
    from prefixtune.engines.base import Hardware

    adapter = get_adapter(engine)
    config = adapter.default_config_for(Hardware(gpu.name, gpu.memory_bytes))
    return SchedulerDefaults(
        int(config.max_running), int(config.max_batched_tokens), adapter.chunked_prefill_default
    )


class TwinModel:
    """One engine as the twin models it. Subclasses set the facts; the defaults are the common case."""

    name: ClassVar[str]  # the engine's adapter name
    # Roofline overheads: seconds per step, seconds per running sequence per step (``cost.py``).
    step_overhead_s: ClassVar[float]
    seq_overhead_s: ClassVar[float]
    # Scheduler traits.
    retracts_decode: ClassVar[bool] = False  # victim: the decoding request with least output (SGLang)
    new_token_ratio: ClassVar[float] = 0.0  # share of running requests' remaining output kept free
    no_evict_policy: ClassVar[str] = ""  # the policy that admits a request only when all of it fits
    # Without chunked prefill, a prompt longer than the token budget is refused at the API (a 400),
    # not run alone in one step (TensorRT-LLM; vLLM refuses such a budget at start instead).
    rejects_over_budget: ClassVar[bool] = False
    policy_aliases: ClassVar[Mapping[str, str]] = {}  # engine policy name -> the twin's, where they differ
    # The KV cache model's options (engine-neutral ``ParsedCommand.options`` names it accepts).
    cache_options: ClassVar[tuple[str, ...]] = ()
    # Serving quirks.
    owned_by: ClassVar[str]  # ``/v1/models`` ``owned_by``
    oom_startup_prefix: ClassVar[str] = "RuntimeError"  # the exception a start-up OOM prints
    error_envelope: ClassVar[bool] = False  # errors as {"error": {...}} (vLLM), else {"object": "error", ...}
    iteration_stats_path: ClassVar[str | None] = None  # TensorRT-LLM's JSON iteration stats route
    # SGLang's server and model information routes (both spellings: the ``get_`` ones are the older),
    # which the routers probe when they register a worker (``twin/serve.py``).
    info_routes: ClassVar[bool] = False
    # vLLM's render routes (the request as its token ids, what vllm-router routes on): answered when
    # the command enables them (``ParsedCommand.options.render_routes``), else 403 as vLLM answers
    # them disabled; an engine without them answers 404 (an unknown route).
    render_routes: ClassVar[bool] = False
    metrics: ClassVar[type[EngineMetrics]]

    # --- scheduler ---------------------------------------------------------------------------------
    def scheduler_defaults(self, gpu: GpuHardware) -> SchedulerDefaults:
        raise NotImplementedError

    def unchunked_budget(self, budget: int, chunked: bool, budget_given: bool, max_model_len: int) -> int:
        """The token budget after the chunked-prefill decision (SGLang caps unchunked prefill, vLLM
        raises its default to ``max_model_len``)."""
        return budget

    def check_limits(self, max_running: int | None, budget: int, chunked: bool, max_model_len: int) -> None:
        """Refuse batch limits the engine refuses at start (``ArgsError``); ``max_running`` is None
        when the command leaves it to the engine's default."""

    def resolve_max_running(self, max_running: int, pool_tokens: int, context_len: int) -> int:
        """The running-request limit once the pool is known (0 may mean "derive it")."""
        return max_running

    def normalize_policy(self, policy: str) -> str:
        """The engine's spelling of a schedule policy (the adapter's choices use it)."""
        return policy.lower().replace("_", "-")

    def twin_policy(self, policy: str) -> str:
        """The twin's queue order for one of the engine's (normalized) policies."""
        return self.policy_aliases.get(policy, policy)

    # --- serving -----------------------------------------------------------------------------------
    def iteration_stats(self, gauges: Gauges) -> list[dict[str, Any]]:
        """The JSON body of ``iteration_stats_path`` (only engines that set that path serve it)."""
        raise NotImplementedError(f"{self.name} serves no iteration stats")

    # --- memory ------------------------------------------------------------------------------------
    def memory_split(self, start: MemoryStart) -> tuple[float, float]:
        """(KV pool bytes, activation budget bytes) per GPU; raises ``StartupOOM``."""
        raise NotImplementedError

    def check_pool(self, pool_tokens: int, max_len: int, kv_bytes_per_token: float) -> None:
        """Refuse to boot when the pool cannot serve the engine's minimum (vLLM: one max-len request)."""

    # --- cache -------------------------------------------------------------------------------------
    def make_cache(
        self, num_blocks: int, block_size: int, prefix_caching: bool, options: Mapping[str, object]
    ) -> KVCache:
        """The engine's KV cache model (``options`` checked against ``cache_options``, None dropped)."""
        raise NotImplementedError


_MODELS: dict[str, TwinModel] = {}
_builtin_loaded = False


def register(model: TwinModel) -> TwinModel:
    """Make ``model`` the twin's model of its engine (the built-in three register themselves)."""
    _MODELS[str(model.name)] = model
    return model


def unregister(name: str) -> None:
    """Forget an engine's model (tests that register a stub engine)."""
    _MODELS.pop(str(name), None)


def _load_builtin() -> None:
    global _builtin_loaded
    if not _builtin_loaded:
        _builtin_loaded = True
        for module in BUILTIN:
            importlib.import_module(f"prefixtune.twin.models.{module}")


def known() -> tuple[str, ...]:
    """The engines the twin has a model for, in registration order."""
    _load_builtin()
    return tuple(_MODELS)


def find_twin_model(engine: object) -> TwinModel | None:
    """The model for ``engine`` (case-insensitive), or None."""
    _load_builtin()
    return _MODELS.get(str(engine).strip().lower())


def twin_model(engine: object) -> TwinModel:
    """The model for ``engine``; ValueError naming the known engines otherwise."""
    model = find_twin_model(engine)
    if model is None:
        raise ValueError(f"unknown engine {engine!r}; known engines: {', '.join(known())}")
    return model
