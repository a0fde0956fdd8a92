"""How long one engine step takes: fitted to measured kernels where there are data, else a roofline.

**Fitted** (``FittedCost``, ``setup.cost_source = "aiconfigurator"``): per (engine, model, GPU, KV
dtype, TP) small tables fitted to the GPU kernels NVIDIA AIConfigurator 0.12.0 measured (GEMMs,
attention, all-reduce; ``twin/data/step_costs.json``, written by ``make calibrate`` through
``twin/calibration.py``; docs/calibration.md)::

    t_step = t_host + t_host_seq*B + linear(N) + allreduce(N) + per_seq(B) + read(B)*S_read + pair*F

**Roofline** (``RooflineCost``, ``setup.cost_source = "roofline"``), where the data have no such case
(a model or GPU AIConfigurator lacks), ``reference/workloads-and-calibration.md`` section C::

    t_mem  = (W_step/eta_w + kappa*S_read/eta_kv) / (TP*BW)
    t_cmp  = (2*P_lin*N_tok + F_attn) / (TP*eta_f*F_peak)      F_attn = sum_i 4*L*d*(n_i*p_i + n_i^2/2)
    t_step = t_oh + t_seq*B + max(t_mem, t_cmp) + [TP>1]*2*L*t_ar

A step processes ``N`` new tokens (decode tokens plus prefill chunks) of ``B`` sequences and reads
``S_read`` cached tokens' KV. In the roofline, ``t_seq`` (per running sequence) is 5 us fitted to the
TensorRT-LLM anchors of B2; engines differ by small multipliers on ``t_oh`` and ``t_seq`` (ours).

Decode runs: with a stable batch of ``B`` decoding sequences, step ``j`` reads ``S0 + j*B`` tokens,
so every term is linear in ``j`` in both models; ``DecodeRun`` sums them in closed form and finds
how many steps fit before a deadline, which is what lets the engine skip ahead.
"""

from __future__ import annotations

import bisect
import itertools
import json
import math
from collections.abc import Sequence
from dataclasses import dataclass, field
from enum import StrEnum
from functools import cache
from importlib import resources
from typing import Any, ClassVar, NamedTuple, Protocol

from prefixtune.twin.catalog import GpuHardware, ModelSpec, kv_dtype_bytes
from prefixtune.twin.models.base import twin_model

# The fitted step costs (bench/calibration/fit.py writes it; ``make calibrate``).
STEP_COSTS_FILE = "step_costs.json"
ROOFLINE_PROVENANCE = "roofline (reference/workloads-and-calibration.md section C); no measured kernels"


class CostSource(StrEnum):
    """Where a twin's step times come from (``setup.cost_source`` of every run)."""

    AICONFIGURATOR = "aiconfigurator"  # fitted to kernels AIConfigurator measured (data/step_costs.json)
    ROOFLINE = "roofline"  # no measured data for this (engine, model, GPU, KV dtype, TP)


ETA_W = 0.8  # weight streaming efficiency
ETA_KV = 0.6  # paged-KV read efficiency
ETA_F = 0.5  # achieved fraction of dense peak
T_AR = 20e-6  # per all-reduce (two per layer with TP > 1)

# Per-engine overheads (t_oh seconds per step, t_seq seconds per running sequence per step) are each
# engine's twin model's ``step_overhead_s`` / ``seq_overhead_s`` (``twin/models/``). t_seq = 5 us fits
# the TensorRT-LLM anchors of B2 within +-20% (tests/twin/test_twin_calibration.py); the engine
# differences (vLLM a little more per-step work in Python, TRT-LLM the least) are ours.


@dataclass(frozen=True)
class RooflineCost:
    """Step-time roofline for one model on one GPU type, TP ranks, KV dtype and engine: the fallback
    where the calibration data has no case (``cost_source`` says which one ran)."""

    model: ModelSpec
    gpu: GpuHardware
    tp: int
    kv_bytes_per_token: float  # all ranks together (kappa)
    t_oh: float
    t_seq: float
    eta_kv: float = ETA_KV
    provenance: str = ROOFLINE_PROVENANCE
    source: ClassVar[CostSource] = CostSource.ROOFLINE

    @classmethod
    def for_engine(
        cls,
        engine: str,
        model: ModelSpec,
        gpu: GpuHardware,
        tp: int,
        kv_dtype: str,
        block_size: int,
        provenance: str = ROOFLINE_PROVENANCE,
    ) -> RooflineCost:
        twin = twin_model(engine)
        t_oh, t_seq = twin.step_overhead_s, twin.seq_overhead_s
        # Small blocks cost kernel efficiency (calibration B4: an assumption, 0.9 below 16 tokens).
        eta_kv = ETA_KV * (0.9 if block_size < 16 else 1.0)
        return cls(model, gpu, tp, float(model.kv_bytes_per_token(kv_dtype)), t_oh, t_seq, eta_kv, provenance)

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


class StepCost(Protocol):
    """What the engine asks of a cost model (``RooflineCost`` or ``FittedCost``)."""

    source: ClassVar[CostSource]

    @property
    def provenance(self) -> str: ...

    def step_time(self, n_seqs: int, new_tokens: int, read_tokens: int, attn_pairs: float) -> float: ...

    def prefill_chunk(self, n: int, p: int) -> tuple[int, float]: ...

    def host_transfer_time(self, tokens: int) -> float: ...

    def decode_run(self, batch: int, read0: int) -> DecodeRun: ...


class _Table:
    """Values at increasing knots, interpolated linearly; beyond the last knot extrapolated along the
    last segment (``extend``) or held; below the first held. Lookups are memoized per argument: the
    engine asks for the same few batch sizes and chunk lengths over and over."""

    __slots__ = ("_memo", "extend", "knots", "values")

    def __init__(self, knots: Sequence[float], values: Sequence[float], extend: bool) -> None:
        if len(knots) != len(values) or len(knots) < 2 or any(b <= a for a, b in itertools.pairwise(knots)):
            raise ValueError("a cost table needs >= 2 increasing knots and one value per knot")
        self.knots = tuple(float(k) for k in knots)
        self.values = tuple(float(v) for v in values)
        self.extend = extend
        self._memo: dict[float, float] = {}

    def __call__(self, x: float) -> float:
        y = self._memo.get(x)  # not try/except: a miss raising KeyError costs more than the lookup
        if y is not None:
            return y
        ks, vs = self.knots, self.values
        if x <= ks[0]:
            y = vs[0]
        elif x >= ks[-1] and not self.extend:
            y = vs[-1]
        else:
            i = min(bisect.bisect_right(ks, x), len(ks) - 1)
            k0, k1, v0, v1 = ks[i - 1], ks[i], vs[i - 1], vs[i]
            y = v0 + (v1 - v0) * (x - k0) / (k1 - k0)
        if len(self._memo) < 65_536:
            self._memo[x] = y
        return y


class FittedCost:
    """Step times fitted to measured kernels (AIConfigurator's database, see ``step_costs.json``)::

        t_step = t_host + t_host_seq*B + linear(N) + allreduce(N) + per_seq(B) + read(B)*S_read + pair*F

    ``N`` new tokens (the linear layers' M: GEMMs, norms, activation, embedding), ``B`` sequences in
    the step (logits GEMM and the attention kernels' fixed part), ``S_read`` KV tokens read and
    ``F = sum_i (n_i*p_i + n_i^2/2)`` attention pairs. ``linear``, ``allreduce``, ``per_seq`` and
    ``read`` are small tables interpolated linearly (``_Table``); ``t_host`` / ``t_host_seq`` are the
    host-side costs the kernel measurements cannot see (``host_overhead`` in the data file).

    For a decode run (fixed ``B`` and ``N = B``) everything but the ``S_read`` / ``F`` terms is
    constant and those grow linearly with the step, so ``DecodeRun``'s closed form holds.
    """

    source: ClassVar[CostSource] = CostSource.AICONFIGURATOR

    def __init__(
        self,
        *,
        linear: _Table,
        allreduce: _Table,
        per_seq: _Table,
        read: _Table,
        pair_s: float,
        t_host: float,
        t_host_seq: float,
        read_penalty: float,
        kv_bytes_per_token: float,
        tp: int,
        pcie_bandwidth: float,
        provenance: str,
    ) -> None:
        self.linear = linear
        self.allreduce = allreduce
        self.per_seq = per_seq
        self.read = read
        self.pair_s = pair_s
        self.t_host = t_host
        self.t_host_seq = t_host_seq
        self.read_penalty = read_penalty
        self.kv_bytes_per_token = kv_bytes_per_token
        self.tp = tp
        self.pcie_bandwidth = pcie_bandwidth
        self.provenance = provenance
        # Hot-path memos (the engine asks for the same few token and sequence counts over and over):
        # tokens -> linear + all-reduce; sequences -> (fixed part of the step, cost per token read).
        self._tok: dict[int, float] = {}
        self._seq: dict[int, tuple[float, float]] = {}
        self._run: dict[int, tuple[float, float]] = {}  # decode-run batch -> (base, cost per token read)

    def _tok_cost(self, n: int) -> float:
        v = self.linear(n) + self.allreduce(n)
        if len(self._tok) < 65_536:
            self._tok[n] = v
        return v

    def _seq_cost(self, b: int) -> tuple[float, float]:
        v = (self.t_host + self.t_host_seq * b + self.per_seq(b), self.read(b) * self.read_penalty)
        if len(self._seq) < 65_536:
            self._seq[b] = v
        return v

    def step_time(self, n_seqs: int, new_tokens: int, read_tokens: int, attn_pairs: float) -> float:
        """One step: ``n_seqs`` sequences, ``new_tokens`` computed, ``read_tokens`` KV read, and
        ``attn_pairs`` = sum_i (n_i*p_i + n_i^2/2)."""
        tok = self._tok.get(new_tokens)
        if tok is None:
            tok = self._tok_cost(new_tokens)
        seq = self._seq.get(n_seqs)
        fixed, per_read = seq if seq is not None else self._seq_cost(n_seqs)
        return tok + fixed + per_read * read_tokens + self.pair_s * attn_pairs

    def prefill_chunk(self, n: int, p: int) -> tuple[int, float]:
        """(tokens read, attention pairs) of a chunk of ``n`` new tokens after ``p`` cached ones."""
        return p + n, n * p + n * n / 2.0

    def host_transfer_time(self, tokens: int) -> float:
        """Onboarding ``tokens`` of KV from the host tier over PCIe (each rank its share, in parallel)."""
        return self.kv_bytes_per_token * tokens / (self.tp * self.pcie_bandwidth)

    def decode_run(self, batch: int, read0: int) -> DecodeRun:
        """Consecutive decode-only steps of ``batch`` sequences whose contexts sum to ``read0``: a
        decode step's pairs are its reads less ``batch/2``, so every step is ``base + per_read*reads``."""
        b = batch
        memo = self._run.get(b)
        if memo is None:
            memo = self._run_cost(b)
        base, per_read = memo
        m0, m1 = per_read * read0, per_read * b
        return DecodeRun(base, m0, m1, m0, m1)

    def _run_cost(self, b: int) -> tuple[float, float]:
        """(base, cost per token read) of a decode run of ``b`` sequences."""
        tok = self._tok.get(b)
        if tok is None:
            tok = self._tok_cost(b)
        seq = self._seq.get(b)
        fixed, per_read = seq if seq is not None else self._seq_cost(b)
        pair = self.pair_s
        per_read += pair
        v = (tok + fixed - pair * b / 2.0, per_read)
        if len(self._run) < 65_536:
            self._run[b] = v
        return v


def _kv_key(kv_dtype: str, model: ModelSpec) -> str:
    return "fp8" if kv_dtype_bytes(kv_dtype, model) == 1 else "bf16"


@cache
def step_cost_data() -> dict[str, Any]:
    """The committed calibration data (package file ``twin/data/step_costs.json``)."""
    text = resources.files("prefixtune.twin").joinpath("data", STEP_COSTS_FILE).read_text()
    data: dict[str, Any] = json.loads(text)
    return data


@cache
def _case_index() -> dict[tuple[str, str, str, str, int], dict[str, Any]]:
    return {(c["engine"], c["model"], c["gpu"], c["kv"], int(c["tp"])): c for c in step_cost_data()["cases"]}


def fitted_case(engine: str, model: str, gpu: str, kv: str, tp: int) -> dict[str, Any] | None:
    """The data file's case for (engine, twin model name, twin GPU name, "bf16" | "fp8", TP), or None."""
    return _case_index().get((str(twin_model(engine).name), model, gpu, kv, int(tp)))


def reload_step_costs() -> None:
    """Forget the loaded data file (after ``make calibrate`` rewrote it in this process)."""
    step_cost_data.cache_clear()
    _case_index.cache_clear()


def fitted_cost(
    case: dict[str, Any],
    engine: str,
    kv_bytes_per_token: float,
    tp: int,
    pcie_bandwidth: float,
    block_size: int,
    default_block: int,
) -> FittedCost:
    """A ``FittedCost`` from one case of the data file (knots in tokens / sequences, times in ms)."""
    data = step_cost_data()
    ms = 1e-3
    tk, sk = case["token_knots"], case["seq_knots"]
    host = data["host_overhead"][str(engine)]
    # Small blocks cost kernel efficiency (calibration B4, an assumption): below 16 tokens, unless the
    # engine's own default is that small (SGLang's page 1: what its kernels were measured with).
    penalty = 1.0 / 0.9 if block_size < min(16, default_block) else 1.0
    prov = (
        f"aiconfigurator {data['provenance']['aiconfigurator_version']}: {case['engine']} "
        f"{case['framework_version']} on {case['system']}, gemm {case['quant']['gemm']}, "
        f"kv {case['quant']['kv']}, tp {case['tp']}"
    )
    return FittedCost(
        linear=_Table(tk, [v * ms for v in case["linear_ms"]], extend=True),
        allreduce=_Table(tk, [v * ms for v in case["allreduce_ms"]], extend=True),
        per_seq=_Table(sk, [v * ms for v in case["per_seq_ms"]], extend=True),
        read=_Table(sk, [v * 1e-9 for v in case["read_ns"]], extend=False),
        pair_s=float(case["pair_ps"]) * 1e-12,
        t_host=float(host["step_us"]) * 1e-6,
        t_host_seq=float(host["seq_us"]) * 1e-6,
        read_penalty=penalty,
        kv_bytes_per_token=kv_bytes_per_token,
        tp=tp,
        pcie_bandwidth=pcie_bandwidth,
        provenance=prov,
    )


def step_cost(
    engine: str,
    model: ModelSpec,
    gpu: GpuHardware,
    tp: int,
    kv_dtype: str,
    block_size: int,
    default_block: int = 16,
) -> StepCost:
    """The fitted cost model where the calibration data has this case, else the roofline."""
    eng = str(twin_model(engine).name)
    kv = _kv_key(kv_dtype, model)
    case = fitted_case(eng, model.name, gpu.name, kv, tp)
    if case is None:
        why = (
            f"{ROOFLINE_PROVENANCE}: no AIConfigurator data for {eng} {model.name} {gpu.name} kv {kv} tp {tp}"
        )
        return RooflineCost.for_engine(eng, model, gpu, tp, kv_dtype, block_size, provenance=why)
    kappa = float(model.kv_bytes_per_token(kv_dtype))
    return fitted_cost(case, eng, kappa, tp, gpu.pcie_bandwidth, block_size, default_block)


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
        base, m0, m1, c0, c1 = self
        # Steps where memory dominates: m0 + m1*j >= c0 + c1*j  <=>  j*(c1 - m1) <= m0 - c0
        dm, dc = m0 - c0, c1 - m1
        if dc == 0 and dm >= 0:  # the fitted model's runs (m == c): all k steps on one line
            # base*k + _lin_sum(m0, m1, 0, k) + _lin_sum(c0, c1, k, k), inline (the hot path)
            return base * k + (m0 * k + m1 * (k - 1) * k / 2.0) + 0.0
        if dc > 0:
            cross = math.floor(dm / dc) + 1 if dm >= 0 else 0  # memory-bound for j < cross
            mem_steps = min(k, max(0, cross))
        elif dc < 0:
            start = math.ceil(dm / dc) if dm < 0 else 0  # memory-bound for j >= start
            start = min(k, max(0, start))
            cmp_part = _lin_sum(c0, c1, 0, start)
            mem_part = _lin_sum(m0, m1, start, k)
            return base * k + cmp_part + mem_part
        else:
            mem_steps = k if dm >= 0 else 0
        return base * k + _lin_sum(m0, m1, 0, mem_steps) + _lin_sum(c0, c1, mem_steps, k)

    def steps_until(self, deadline: float) -> int:
        """The fewest steps whose total time reaches ``deadline`` (>= 1)."""
        if deadline <= 0:
            return 1
        base, m0, m1, c0, c1 = self
        # Steps never get shorter, so deadline/step(0) steps are enough; usually the answer is near it.
        # (step(j) inline: base + max(m0 + m1*j, c0 + c1*j), max as the builtin picks it.)
        a, b = m0 + m1 * 0, c0 + c1 * 0
        hi = math.ceil(deadline / (base + (b if b > a else a)))
        if hi < 1:
            hi = 1
        a, b = m0 + m1 * (hi - 1), c0 + c1 * (hi - 1)
        lo = math.floor(deadline / (base + (b if b > a else a)))  # even the longest step: not fewer
        if lo < 1:
            lo = 1
        total = self.total
        if lo >= hi or total(hi - 1) < deadline:
            return hi
        while lo < hi:
            mid = (lo + hi) // 2
            if total(mid) >= deadline:
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
