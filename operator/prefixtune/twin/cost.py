"""How long one engine step takes: the roofline of ``reference/workloads-and-calibration.md`` section C.

A step processes ``N_tok`` new tokens (decode tokens plus prefill chunks) and reads ``S_read`` cached
tokens' KV::

    t_mem  = (W_step/eta_w + kappa*S_read/eta_kv) / (TP*BW)
    t_cmp  = (2*P_lin*N_tok + F_attn) / (TP*eta_f*F_peak)      F_attn = sum_i 4*L*d*(n_i*p_i + n_i^2/2)
    t_step = t_oh + t_seq*B + max(t_mem, t_cmp) + [TP>1]*2*L*t_ar

``t_seq`` (per running sequence: sampling, block tables, input preparation) is the per-sequence cost
section C suggests to stop the model being optimistic at very large decode batches; 5 us is fitted
to the TensorRT-LLM anchors of B2 (see tests/twin/test_twin_calibration.py). Engines differ by
small multipliers on ``t_oh`` and ``t_seq`` (ours; not measured).

Decode runs: with a stable batch of ``B`` decoding sequences, step ``j`` reads ``S0 + j*B`` tokens,
so both roofline terms are linear in ``j``; ``DecodeRun`` sums them in closed form and finds how many
steps fit before a deadline, which is what lets the engine skip ahead.
"""

from __future__ import annotations

import math
from dataclasses import dataclass, field
from typing import NamedTuple

from prefixtune.engines.base import EngineName
from prefixtune.twin.catalog import GpuSpec, ModelSpec

ETA_W = 0.8  # weight streaming efficiency
ETA_KV = 0.6  # paged-KV read efficiency
ETA_F = 0.5  # achieved fraction of dense peak
T_AR = 20e-6  # per all-reduce (two per layer with TP > 1)

# Per-engine overheads: (t_oh seconds per step, t_seq seconds per running sequence per step).
# t_seq = 5 us fits the TensorRT-LLM anchors of B2 within +-20% (tests/twin/test_twin_calibration.py);
# the engine differences (vLLM a little more per-step work in Python, TRT-LLM the least) are ours.
ENGINE_OVERHEADS: dict[EngineName, tuple[float, float]] = {
    EngineName.VLLM: (1.5e-3, 6e-6),
    EngineName.SGLANG: (1.4e-3, 5e-6),
    EngineName.TRTLLM: (1.3e-3, 5e-6),
}


@dataclass(frozen=True)
class CostModel:
    """Step-time roofline for one model on one GPU type, TP ranks, KV dtype and engine."""

    model: ModelSpec
    gpu: GpuSpec
    tp: int
    kv_bytes_per_token: float  # all ranks together (kappa)
    t_oh: float
    t_seq: float
    eta_kv: float = ETA_KV

    @classmethod
    def for_engine(
        cls, engine: EngineName | str, model: ModelSpec, gpu: GpuSpec, tp: int, kv_dtype: str, block_size: int
    ) -> CostModel:
        t_oh, t_seq = ENGINE_OVERHEADS[EngineName(engine)]
        # Small blocks cost kernel efficiency (calibration B4: an assumption, 0.9 below 16 tokens).
        eta_kv = ETA_KV * (0.9 if block_size < 16 else 1.0)
        return cls(model, gpu, tp, float(model.kv_bytes_per_token(kv_dtype)), t_oh, t_seq, eta_kv)

    def __post_init__(self) -> None:
        # Constants of the hot path, computed once (the dataclass is frozen).
        bw = self.tp * self.gpu.bandwidth
        flops = self.tp * ETA_F * self.gpu.peak_flops(self.model.weight_dtype)
        consts = {
            "t_fixed": self.t_oh + (2 * self.model.layers * T_AR if self.tp > 1 else 0.0),
            "t_weights": self.model.streamed_bytes / ETA_W / bw,
            "t_per_read": self.kv_bytes_per_token / self.eta_kv / bw,
            "t_per_new": self.model.linear_flops_per_token / flops,
            "t_per_pair": self.model.attn_flops_per_pair / flops,
        }
        for name, value in consts.items():
            object.__setattr__(self, name, value)

    # Per-step coefficients (set in __post_init__):
    t_fixed: float = field(init=False)  # launch/scheduling overhead and TP all-reduces
    t_weights: float = field(init=False)  # streaming the weights once
    t_per_read: float = field(init=False)  # memory time per cached token read
    t_per_new: float = field(init=False)  # compute time per new token through the linear layers
    t_per_pair: float = field(init=False)  # compute time per (query, key) attention pair

    def step_time(self, n_seqs: int, new_tokens: int, read_tokens: int, attn_pairs: float) -> float:
        """One step: ``n_seqs`` sequences, ``new_tokens`` computed, ``read_tokens`` KV read, and
        ``attn_pairs`` = sum_i (n_i*p_i + n_i^2/2)."""
        t_mem = self.t_weights + self.t_per_read * read_tokens
        t_cmp = self.t_per_new * new_tokens + self.t_per_pair * attn_pairs
        return self.t_fixed + self.t_seq * n_seqs + max(t_mem, t_cmp)

    def prefill_chunk(self, n: int, p: int) -> tuple[int, float]:
        """(tokens read, attention pairs) of a chunk of ``n`` new tokens after ``p`` cached ones."""
        return p + n, n * p + n * n / 2.0

    def host_transfer_time(self, tokens: int) -> float:
        """Onboarding ``tokens`` of KV from the host tier over PCIe (each rank its share, in parallel)."""
        return self.kv_bytes_per_token * tokens / (self.tp * self.gpu.pcie_bandwidth)

    def decode_run(self, batch: int, read0: int) -> DecodeRun:
        """Consecutive decode-only steps of ``batch`` sequences whose contexts sum to ``read0``.

        A decode step computes one token per sequence after its ``p`` cached ones and reads ``p+1``;
        ``read0`` is the sum over the batch of ``p+1`` at the first step.
        """
        b = batch
        base = self.t_fixed + self.t_seq * b
        # t_mem(j) = m0 + m1*j ; t_cmp(j) = c0 + c1*j, with reads read0 + j*b and pairs ~ reads.
        m0 = self.t_weights + self.t_per_read * read0
        m1 = self.t_per_read * b
        c0 = self.t_per_new * b + self.t_per_pair * (read0 - b / 2.0)
        c1 = self.t_per_pair * b
        return DecodeRun(base, m0, m1, c0, c1)


class DecodeRun(NamedTuple):
    """Step times ``t(j) = base + max(m0 + m1*j, c0 + c1*j)`` for ``j = 0, 1, ...``.

    A named tuple: the engine makes one per decode run, and a tuple is the cheapest immutable record.
    """

    base: float
    m0: float
    m1: float
    c0: float
    c1: float

    def step(self, j: int) -> float:
        return self.base + max(self.m0 + self.m1 * j, self.c0 + self.c1 * j)

    def total(self, k: int) -> float:
        """Sum of the first ``k`` step times, in closed form."""
        if k <= 0:
            return 0.0
        # Steps where memory dominates: m0 + m1*j >= c0 + c1*j  <=>  j*(c1 - m1) <= m0 - c0
        dm, dc = self.m0 - self.c0, self.c1 - self.m1
        if dc > 0:
            cross = math.floor(dm / dc) + 1 if dm >= 0 else 0  # memory-bound for j < cross
            mem_steps = min(k, max(0, cross))
        elif dc < 0:
            start = math.ceil(dm / dc) if dm < 0 else 0  # memory-bound for j >= start
            start = min(k, max(0, start))
            cmp_part = _lin_sum(self.c0, self.c1, 0, start)
            mem_part = _lin_sum(self.m0, self.m1, start, k)
            return self.base * k + cmp_part + mem_part
        else:
            mem_steps = k if dm >= 0 else 0
        return (
            self.base * k
            + _lin_sum(self.m0, self.m1, 0, mem_steps)
            + _lin_sum(self.c0, self.c1, mem_steps, k)
        )

    def steps_until(self, deadline: float) -> int:
        """The fewest steps whose total time reaches ``deadline`` (>= 1)."""
        if deadline <= 0:
            return 1
        # Steps never get shorter, so deadline/step(0) steps are enough; usually the answer is near it.
        hi = max(1, math.ceil(deadline / self.step(0)))
        lo = max(1, math.floor(deadline / self.step(hi - 1)))  # even the longest step: not fewer
        if lo >= hi or self.total(hi - 1) < deadline:
            return hi
        while lo < hi:
            mid = (lo + hi) // 2
            if self.total(mid) >= deadline:
                hi = mid
            else:
                lo = mid + 1
        return lo


def _lin_sum(a: float, b: float, lo: int, hi: int) -> float:
    """sum_{j=lo}^{hi-1} (a + b*j)."""
    n = hi - lo
    if n <= 0:
        return 0.0
    return a * n + b * (lo + hi - 1) * n / 2.0
