"""Step 3 of `make contract` (project venv): compare vLLM's own exposition with what the recipe reads
and what the twin serves (names, types, labels, buckets); assemble the report. Prints JSON.
Usage: python compare.py CASES.json CHECK.json OUT.json SECONDS_TOTAL
"""

from __future__ import annotations

import json
import sys
from pathlib import Path
from typing import Any

from prefixtune.engines import get_adapter

HISTOGRAM_SUFFIXES = ("_bucket", "_count", "_sum")
CONFIG_INFO = "vllm:cache_config_info"
# The labels VllmAdapter.effective_config reads (block_size, memory fraction, caching, KV blocks).
CONFIG_LABELS = ("block_size", "gpu_memory_utilization", "enable_prefix_caching", "num_gpu_blocks")


def family(name: str) -> str:
    """The exposition family of a series name as the recipe writes it (counters end in _total)."""
    if name.endswith("_total"):
        return name.removesuffix("_total")
    for suffix in HISTOGRAM_SUFFIXES:
        if name.endswith(suffix):
            return name.removesuffix(suffix)
    return name


def expected_type(name: str) -> str:
    names = get_adapter("vllm").metrics
    if name in (names.ttft, names.itl, names.e2e) or name.endswith("_seconds"):
        return "histogram"
    return "counter" if name.endswith("_total") else "gauge"


def compare(real: dict[str, Any], twin: dict[str, Any], recipe: list[str]) -> dict[str, Any]:
    problems: list[str] = []
    if CONFIG_INFO in real:
        lacking = sorted(set(CONFIG_LABELS) - set(real[CONFIG_INFO]["labels"]))
        if lacking:
            problems.append(f"{CONFIG_INFO} lacks the labels the adapter reads: {lacking}")
    for name in recipe:
        fam = family(name)
        if fam not in real:
            problems.append(f"recipe reads {name}: vLLM 0.33 has no such family")
        elif real[fam]["type"] != expected_type(name):
            problems.append(
                f"recipe reads {name} as {expected_type(name)}: vLLM exports a {real[fam]['type']}"
            )
    twin_diffs: list[str] = []
    for fam, spec in sorted(twin.items()):
        if not fam.startswith("vllm:"):
            continue
        theirs = real.get(fam)
        if theirs is None:
            twin_diffs.append(f"twin serves {fam}: not in vLLM 0.33")
            continue
        for key in ("type", "labels", "buckets"):
            if key == "labels" and fam == CONFIG_INFO:
                # An info gauge: vLLM puts every CacheConfig field in a label. The twin must carry a
                # subset of them, including every label the adapter reads back.
                extra = sorted(set(spec[key]) - set(theirs[key]))
                lacking = sorted(set(CONFIG_LABELS) - set(spec[key]))
                if extra or lacking:
                    twin_diffs.append(
                        f"{fam} labels: twin has {extra} vLLM lacks, lacks read labels {lacking}"
                    )
                continue
            if spec[key] != theirs[key]:
                twin_diffs.append(f"{fam} {key}: twin {spec[key]}, vLLM {theirs[key]}")
    read = {family(n) for n in recipe}
    serves_read = [f for f in sorted(read) if f in real and f not in twin]
    problems += [f"twin does not serve {f}, which the recipe reads" for f in serves_read]
    # Differences in families the recipe reads are failures; others are reported only.
    failing = [d for d in twin_diffs if d.split(" ", 2)[1 if d.startswith("twin") else 0] in read]
    return {
        "families_in_vllm": len(real),
        "recipe_reads": sorted(read),
        "problems": problems + failing,
        "twin_differences_not_read": [d for d in twin_diffs if d not in failing],
    }


def main() -> int:
    cases = json.loads(Path(sys.argv[1]).read_text())
    check = json.loads(Path(sys.argv[2]).read_text())
    report: dict[str, Any] = {
        "vllm": "0.33.0",
        "sglang": "0.5.23",
        "platform": check.get("platform"),
        "command_lines": check["engines"],
        "parse_failures": check["failures"],
        # value sets (vLLM quantization methods, SGLang policies and which are cache-aware) and the
        # command lines prefixtune refuses that the engines must refuse too
        "set_problems": check.get("set_problems", ["not checked"]),
        # batch-limit pairs (token budget, running cap) run through vLLM's SchedulerConfig: those
        # prefixtune renders (it must accept them) and those it refuses (it must refuse them too)
        "vllm_scheduler_pairs": check.get("vllm_scheduler_pairs"),
        "check_seconds": check.get("seconds"),
        "total_seconds": float(sys.argv[4]) if len(sys.argv) > 4 else None,
    }
    if "vllm_metrics" in check:
        twin = cases["vllm_metrics"]["twin"]
        report["vllm_metrics"] = compare(check["vllm_metrics"], twin, cases["vllm_metrics"]["recipe"])
        ok_metrics = not report["vllm_metrics"]["problems"]
    else:
        report["vllm_metrics"] = {"error": check.get("vllm_metrics_error")}
        ok_metrics = False
    report["ok"] = not check["failures"] and ok_metrics and not report["set_problems"]
    text = json.dumps(report, indent=2, sort_keys=True)
    Path(sys.argv[3]).write_text(text + "\n")
    print(text)
    return 0 if report["ok"] else 1


if __name__ == "__main__":
    raise SystemExit(main())
