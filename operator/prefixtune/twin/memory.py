"""GPU memory: how big each engine's KV pool is, and when the engine runs out of memory.

Each engine reads its memory fraction differently (``reference/engines.md`` 4.1-4.3, calibration B5).
All figures are per GPU (with tensor parallelism, weights, KV heads and activations are split). The
split below is each engine's ``TwinModel.memory_split`` (``twin/models/``); this module holds what is
common.

* vLLM: ``pool = u*M - weights - non-torch - activation peak - cudagraph estimate``. The activation
  peak is what the start-up profile run measured: a dummy forward of ``max_num_batched_tokens``.
  vLLM refuses to start when the memory free at start (``M`` minus the CUDA context) is below ``u*M``.
* SGLang: ``pool = u*M_free_at_start - weights``; activations, CUDA graphs and non-torch buffers live
  outside the fraction, in ``(1-u)*M_free_at_start``.
* TensorRT-LLM: a dry run measures the peak (weights, non-torch, activations of ``max_num_tokens``,
  graphs); ``pool = u*(M - peak)``.

Start-up failure (``oom_startup``): weights do not fit, nothing is left for the pool, the pool cannot
hold one block, or (vLLM, which checks it) one ``max_model_len`` sequence; SGLang/TRT-LLM instead cap
the longest request at the pool size.

Runtime OOM (``oom_runtime``) — the model, which is ours, not measured: a step needs activation memory
``act_per_token * tokens_in_step + act_per_seq * running_requests``. The per-token part is the
forward pass (hidden states, MLP intermediates); the per-sequence part is state that grows with the
batch, not the step: logits in FP32 over the vocabulary plus the sampler's probabilities and sort
buffers (about 4 * vocab * 4 bytes per running request). Start-up profiles cover the per-token part at
the configured token budget, not a large batch of running sequences. The memory a step may use is the
profiled reserve plus what the fraction left outside the pool; when the need exceeds it the engine
dies (``oom_runtime``). So a high fraction boots, then dies once the batch grows. Before that, under
pressure (need above half the budget) the PyTorch caching allocator frees and retries allocations,
which we model as a step-time penalty growing (quadratically) to +60% at the limit: throughput drops
at the high end before the OOM.
"""

from __future__ import annotations

import math
from dataclasses import dataclass

from prefixtune.twin.catalog import GIB, GpuHardware, ModelSpec
from prefixtune.twin.models.base import twin_model

CUDA_CONTEXT_BYTES = 0.5 * GIB  # CUDA context + cuBLAS workspaces: taken before any fraction applies
NCCL_BYTES = 0.4 * GIB  # extra buffers per GPU with TP > 1
NON_TORCH_BYTES = 0.35 * GIB  # persistent non-torch allocations (vLLM issue #10517 measured 0.35 GiB)
SAMPLER_BUFFERS_PER_SEQ = 4  # FP32 vocab-sized buffers per running request (logits, probs, 2 sort buffers)
PRESSURE_START = 0.5  # fraction of the activation budget above which allocation retries slow steps
PRESSURE_MAX_PENALTY = 0.6  # step-time penalty at 100% of the budget


class StartupOOM(RuntimeError):
    """The engine would fail to start (it crashes at boot with an out-of-memory or capacity error)."""

    status = "oom_startup"


@dataclass(frozen=True)
class MemoryStart:
    """What an engine's memory split starts from, per GPU (bytes): the engine's twin model turns it
    into a KV pool and an activation budget (``TwinModel.memory_split``)."""

    fraction: float  # the memory fraction knob
    gpu_bytes: float
    weights: float
    free_at_start: float  # after the CUDA context (and NCCL buffers with TP > 1)
    profile: float  # the profiled activation peak at the token budget
    graphs: float  # the CUDA-graph estimate
    max_batched_tokens: int
    gpu_name: str


def cudagraph_bytes(model: ModelSpec) -> float:
    """Memory of captured CUDA graphs (vLLM's estimate; SGLang/TRT-LLM capture similar graphs)."""
    return 64 * 1024**2 + model.layers * 12 * 1024**2


def act_per_token_bytes(model: ModelSpec, tp: int) -> float:
    """Forward-pass activation bytes per token in a step, per GPU (BF16, x2 for temporaries)."""
    per_token = (
        2 * model.ffn / tp + 4 * model.hidden + (model.heads + 2 * model.kv_heads) * model.head_dim / tp
    )
    return per_token * 2 * 2


def act_per_seq_bytes(model: ModelSpec) -> float:
    """Per running request: FP32 logits over the vocabulary and the sampler's buffers (gathered: per GPU)."""
    return SAMPLER_BUFFERS_PER_SEQ * model.vocab * 4.0


@dataclass(frozen=True)
class MemoryPlan:
    """The memory layout of one engine instance (per GPU) and its runtime-activation budget."""

    engine: str
    gpu_bytes: float
    weights_bytes: float
    kv_bytes_per_token: float  # per GPU
    pool_bytes: float
    block_size: int
    num_blocks: int
    act_per_token: float
    act_per_seq: float
    activation_budget: float  # bytes a step may use for activations before OOM
    max_request_tokens: int  # longest prompt + output the engine accepts

    @property
    def pool_tokens(self) -> int:
        return self.num_blocks * self.block_size

    def activation_need(self, step_tokens: int, running: int) -> float:
        return self.act_per_token * step_tokens + self.act_per_seq * running

    def pressure(self, step_tokens: int, running: int) -> float:
        """Activation need / budget: above 1 the step runs out of memory."""
        # activation_need's expression inline (twice per engine step)
        return (self.act_per_token * step_tokens + self.act_per_seq * running) / self.activation_budget

    def step_penalty(self, pressure: float) -> float:
        """Multiplier on step time from allocator retries under memory pressure (1.0 when relaxed)."""
        if pressure <= PRESSURE_START:
            return 1.0
        x = min(1.0, (pressure - PRESSURE_START) / (1.0 - PRESSURE_START))
        return 1.0 + PRESSURE_MAX_PENALTY * x * x

    def max_running_without_oom(self, step_tokens: int) -> int:
        """Largest running batch that fits the budget with ``step_tokens`` tokens in the step."""
        left = self.activation_budget - self.act_per_token * step_tokens
        return max(0, math.floor(left / self.act_per_seq))

    def to_dict(self) -> dict[str, float | int | str]:
        return {
            "engine": self.engine,
            "gpu_gib": round(self.gpu_bytes / GIB, 3),
            "weights_gib": round(self.weights_bytes / GIB, 3),
            "kv_bytes_per_token": int(self.kv_bytes_per_token),
            "pool_gib": round(self.pool_bytes / GIB, 3),
            "pool_tokens": int(self.pool_tokens),
            "num_blocks": int(self.num_blocks),
            "block_size": int(self.block_size),
            "activation_budget_gib": round(self.activation_budget / GIB, 3),
            "max_request_tokens": int(self.max_request_tokens),
        }


def plan_memory(
    engine: str,
    model: ModelSpec,
    gpu: GpuHardware,
    tp: int,
    memory_fraction: float,
    block_size: int,
    kv_dtype: str,
    max_batched_tokens: int,
    max_model_len: int | None,
) -> MemoryPlan:
    """The KV pool and activation budget per GPU; raises ``StartupOOM`` when the engine would not boot."""
    model_t = twin_model(engine)
    u = float(memory_fraction)
    if not 0.0 < u <= 1.0:
        raise ValueError(f"memory_fraction must be in (0, 1]; got {u}")
    if block_size < 1:
        raise ValueError(f"block_size must be >= 1; got {block_size}")
    m = gpu.memory_bytes
    w = model.weight_bytes / tp
    kappa = model.kv_bytes_per_token(kv_dtype) / tp
    ctx = CUDA_CONTEXT_BYTES + (NCCL_BYTES if tp > 1 else 0.0)
    graphs = cudagraph_bytes(model)
    a_tok = act_per_token_bytes(model, tp)
    a_seq = act_per_seq_bytes(model)
    profile = a_tok * max_batched_tokens  # the profiled/dry-run activation peak
    free_at_start = m - ctx
    gib = GIB

    if w + ctx >= m:
        raise StartupOOM(
            f"model weights ({w / gib:.1f} GiB per GPU at TP={tp}) do not fit in {gpu.name} "
            f"memory ({m / gib:.1f} GiB)"
        )
    pool, budget = model_t.memory_split(
        MemoryStart(u, m, w, free_at_start, profile, graphs, max_batched_tokens, gpu.name)
    )

    block_bytes = kappa * block_size
    num_blocks = int(pool // block_bytes) if pool > 0 else 0
    if num_blocks < 1:
        raise StartupOOM(
            f"{model_t.name}: no memory left for the KV cache (pool {max(pool, 0) / gib:.2f} GiB) after "
            f"{w / gib:.1f} GiB of weights per GPU; raise the memory fraction or use more GPUs"
        )
    pool_tokens = num_blocks * block_size
    max_len = int(max_model_len) if max_model_len else model.max_model_len
    model_t.check_pool(pool_tokens, max_len, kappa)
    return MemoryPlan(
        engine=model_t.name,
        gpu_bytes=m,
        weights_bytes=w,
        kv_bytes_per_token=kappa,
        pool_bytes=pool,
        block_size=block_size,
        num_blocks=num_blocks,
        act_per_token=a_tok,
        act_per_seq=a_seq,
        activation_budget=budget,
        max_request_tokens=min(max_len, pool_tokens),
    )
