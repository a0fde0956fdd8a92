"""Did the engine run the knobs it was given? The effective config read back after a rollout.

Each adapter reads its engine's config-info series (``EngineAdapter.effective_config``: vLLM's
``vllm:cache_config_info``, SGLang's ``sglang:page_size`` / ``sglang:max_total_num_tokens``,
TensorRT-LLM's ``trtllm_kv_cache_config_info`` where the release has it). A knob the engine reports
with another value than rendered (TensorRT-LLM's shallow merge of kv_cache_config, a page size a
backend forces, a block size re-aligned for a hybrid model) is a mismatch: the trial did not run
what it claims, so it is never scored. Knobs an engine does not report cannot be checked.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass

from prefixtune.engines.base import EngineAdapter, KnobConfig
from prefixtune.engines.knobs import BY_NAME, KNOB_NAMES
from prefixtune.metrics.exposition import Snapshot

FRACTION_TOLERANCE = 1e-3  # label text round-trips floats; anything beyond this is another value


@dataclass(frozen=True)
class ReadBack:
    """What one pod reports running."""

    pod: str
    effective: Mapping[str, object]

    @property
    def kv_tokens(self) -> int | None:
        value = self.effective.get("kv_tokens")
        return value if isinstance(value, int) else None


def read_back(adapter: EngineAdapter, pod: str, snap: Snapshot) -> ReadBack:
    samples = [(name, dict(labels), value) for (name, labels), value in snap.values.items()]
    return ReadBack(pod, adapter.effective_config(samples))


def _differs(knob: str, intended: object, running: object) -> bool:
    if BY_NAME[knob].continuous:
        assert isinstance(intended, int | float) and isinstance(running, int | float)
        return abs(float(intended) - float(running)) > FRACTION_TOLERANCE
    return bool(intended != running)


def mismatches(intended: KnobConfig, reads: Sequence[ReadBack]) -> list[str]:
    """ "knob: intended X, running Y (pod P)" for every knob a pod reports with another value."""
    wanted = intended.to_dict()
    out = []
    for read in reads:
        for knob in KNOB_NAMES:  # those the engine reports (its adapter's label bindings)
            if knob in read.effective and _differs(knob, wanted[knob], read.effective[knob]):
                out.append(
                    f"{knob}: intended {wanted[knob]}, running {read.effective[knob]} (pod {read.pod})"
                )
    return out


def kv_tokens(reads: Sequence[ReadBack]) -> int | None:
    """The KV pool (tokens) the pods report: the smallest, when they differ."""
    pools = [r.kv_tokens for r in reads if r.kv_tokens is not None]
    return min(pools) if pools else None
