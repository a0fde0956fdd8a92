"""Models and GPUs the twin knows: the constants of the cost and memory models.

Figures are from ``reference/workloads-and-calibration.md`` table B1 (HF configs; weight bytes and
FLOPs computed there). A model is one checkpoint: the same architecture with FP8 weights is a
separate entry, because it changes the bytes streamed per step and the compute peak.

FP8 weights on A100 (no FP8 tensor cores): *emulated* as weight-only FP8, the way vLLM runs FP8
checkpoints on Ampere (Marlin W8A16 kernels): weights take FP8 bytes in memory and in the per-step
stream, compute runs at the BF16 peak. FP8 KV on A100 is stored as FP8 and computed in BF16 likewise.
"""

from __future__ import annotations

from dataclasses import dataclass

GIB = 1024**3


@dataclass(frozen=True)
class ModelSpec:
    name: str  # short, canonical name
    hf_names: tuple[str, ...]  # checkpoints that are this model
    layers: int
    hidden: int
    heads: int
    kv_heads: int
    head_dim: int
    ffn: int
    vocab: int
    params: float  # total parameters
    weight_dtype: str  # "bf16" | "fp8"
    weight_bytes: float  # resident on the GPU(s), all ranks together
    streamed_bytes: float  # read per forward step (embedding table excluded)
    linear_flops_per_token: float  # 2 * (P_layers + P_lm_head)
    max_model_len: int = 131_072

    @property
    def attn_flops_per_pair(self) -> float:
        """FLOPs per (query, key) pair over all layers: 4 * L * d."""
        return 4.0 * self.layers * self.hidden

    def kv_bytes_per_token(self, kv_dtype: str) -> int:
        """KV bytes per token over all layers and all TP ranks: 2 * L * n_kv * head_dim * bytes."""
        return 2 * self.layers * self.kv_heads * self.head_dim * kv_dtype_bytes(kv_dtype, self)


@dataclass(frozen=True)
class GpuHardware:
    name: str
    aliases: tuple[str, ...]
    memory_bytes: float  # what CUDA reports as total (usable)
    bandwidth: float  # HBM bytes/s
    bf16_flops: float  # dense
    fp8_flops: float | None  # dense; None where there are no FP8 tensor cores
    pcie_bandwidth: float = 50e9  # host <-> device, effective

    def peak_flops(self, dtype: str) -> float:
        if dtype == "fp8" and self.fp8_flops is not None:
            return self.fp8_flops
        return self.bf16_flops  # BF16, or FP8 emulated as weight-only on GPUs without FP8


def kv_dtype_bytes(kv_dtype: str, model: ModelSpec | None = None) -> int:
    """Bytes per KV element. ``auto`` follows the model's activation dtype (BF16 for these models)."""
    key = kv_dtype.lower()
    if key in {"auto", "bf16", "bfloat16", "fp16", "float16", "half"}:
        return 2
    if key in {"fp8", "fp8_e4m3", "fp8_e5m2", "fp8_ds_mla"}:
        return 1
    raise ValueError(f"kv_cache_dtype {kv_dtype!r} is not supported by the twin; use auto, bfloat16 or fp8")


_8B = dict(
    layers=32, hidden=4096, heads=32, kv_heads=8, head_dim=128, ffn=14_336, vocab=128_256, params=8.03e9
)
_70B = dict(
    layers=80, hidden=8192, heads=64, kv_heads=8, head_dim=128, ffn=28_672, vocab=128_256, params=70.55e9
)

MODELS: tuple[ModelSpec, ...] = (
    ModelSpec(
        name="llama-3.1-8b",
        hf_names=(
            "meta-llama/Llama-3.1-8B-Instruct",
            "meta-llama/Llama-3.1-8B",
            "meta-llama/Meta-Llama-3.1-8B-Instruct",
            "meta-llama/Meta-Llama-3.1-8B",
        ),
        weight_dtype="bf16",
        weight_bytes=16.1e9,
        streamed_bytes=15.0e9,
        linear_flops_per_token=15.0e9,
        **_8B,  # type: ignore[arg-type]
    ),
    ModelSpec(
        name="llama-3.1-8b-fp8",
        hf_names=(
            "nvidia/Llama-3.1-8B-Instruct-FP8",
            "neuralmagic/Meta-Llama-3.1-8B-Instruct-FP8",
            "RedHatAI/Meta-Llama-3.1-8B-Instruct-FP8",
        ),
        weight_dtype="fp8",
        weight_bytes=9.1e9,
        streamed_bytes=8.0e9,
        linear_flops_per_token=15.0e9,
        **_8B,  # type: ignore[arg-type]
    ),
    ModelSpec(
        name="llama-3.3-70b-fp8",
        hf_names=(
            "nvidia/Llama-3.3-70B-Instruct-FP8",
            "RedHatAI/Llama-3.3-70B-Instruct-FP8-dynamic",
            "neuralmagic/Llama-3.3-70B-Instruct-FP8-dynamic",
        ),
        weight_dtype="fp8",
        weight_bytes=72.7e9,
        streamed_bytes=70.6e9,
        linear_flops_per_token=139e9,
        **_70B,  # type: ignore[arg-type]
    ),
    ModelSpec(
        name="llama-3.3-70b",
        hf_names=("meta-llama/Llama-3.3-70B-Instruct",),
        weight_dtype="bf16",
        weight_bytes=141.1e9,
        streamed_bytes=139e9,
        linear_flops_per_token=139e9,
        **_70B,  # type: ignore[arg-type]
    ),
)

GPUS: tuple[GpuHardware, ...] = (
    GpuHardware(
        name="H100-80GB",
        aliases=("h100", "h100-sxm", "h100-80gb-hbm3", "nvidia-h100-80gb-hbm3", "h100-sxm5"),
        memory_bytes=79.1 * GIB,
        bandwidth=3.35e12,
        bf16_flops=989e12,
        fp8_flops=1979e12,
    ),
    GpuHardware(
        name="H200",
        aliases=("h200-141gb", "h200-sxm", "nvidia-h200", "h200-141gb-hbm3e"),
        memory_bytes=139.8 * GIB,
        bandwidth=4.8e12,
        bf16_flops=989e12,
        fp8_flops=1979e12,
    ),
    GpuHardware(
        name="A100-80GB",
        aliases=("a100", "a100-sxm", "a100-80gb-sxm", "nvidia-a100-sxm4-80gb", "a100-sxm4-80gb"),
        memory_bytes=79.15 * GIB,
        bandwidth=2.0e12,
        bf16_flops=312e12,
        fp8_flops=None,
        pcie_bandwidth=25e9,  # PCIe Gen4 x16
    ),
)

MAX_TP = 2


def _norm(name: str) -> str:
    return name.strip().lower().replace("_", "-")


def model_names() -> list[str]:
    out: list[str] = []
    for m in MODELS:
        out.append(m.name)
        out.extend(m.hf_names)
    return out


def get_model(name: str) -> ModelSpec:
    """A model by short name or HF checkpoint name (case-insensitive)."""
    key = _norm(name)
    for m in MODELS:
        if key == m.name or key in {_norm(h) for h in m.hf_names}:
            return m
    raise ValueError(f"unknown model {name!r}; known models: {', '.join(model_names())}")


def find_gpu(name: str) -> GpuHardware | None:
    """The twin's model of a GPU by name or alias (case-insensitive); None when it has none."""
    key = _norm(name)
    for g in GPUS:
        if key == _norm(g.name) or key in g.aliases:
            return g
    return None


def no_twin_model(name: str) -> str:
    """What to say of a GPU the twin does not model (the one wording for every caller)."""
    return f"no twin model for GPU {name!r} (the twin models {', '.join(g.name for g in GPUS)})"


def get_gpu(name: str) -> GpuHardware:
    found = find_gpu(name)
    if found is not None:
        return found
    known = ", ".join(f"{g.name} (aliases: {', '.join(g.aliases)})" for g in GPUS)
    raise ValueError(f"unknown gpu {name!r}: {no_twin_model(name)}; known GPUs: {known}")


def check_tp(tp: int) -> int:
    if isinstance(tp, bool) or not isinstance(tp, int) or not 1 <= tp <= MAX_TP:
        raise ValueError(f"tensor parallel size (--tp / tensor_parallel) must be 1..{MAX_TP}; got {tp!r}")
    return tp
