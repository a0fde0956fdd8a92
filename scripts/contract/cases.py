"""Step 1 of `make contract` (project venv): every command line the adapters can render, as JSON.

Every categorical knob value x memory-fraction edges x TP 1/2 for vLLM and SGLang; every pair of
batch limits a space can search (each ladder value and the engine default, of both; vLLM also with
chunked prefill off) and the ends of their valid ranges; every Deployment rendered from examples/,
and every extraArgs sample the validation accepts, each with the values the engine's own parser must
read back; vLLM under every routing policy (``--enable-scale-out`` whenever a router may be in front).
The pairs the adapters refuse go to step 2 too: the engine must refuse them. Also the
twin's exposition and the recipe's names for vLLM, for step 3. Usage: python cases.py OUT.json
"""

from __future__ import annotations

import itertools
import json
import sys
from pathlib import Path
from typing import Any

import yaml

from prefixtune.api import parse_spec, validate_spec
from prefixtune.controller import render as R
from prefixtune.engines import get_adapter
from prefixtune.engines.base import MAX_BATCHED_TOKENS, MAX_RUNNING, ArgsError, KnobConfig
from prefixtune.engines.knobs import ENGINE_DEFAULT
from prefixtune.engines.sglang import itl_buckets, ttft_buckets
from prefixtune.routing.policy import AUTO_POLICY, RoutingPolicy

ROOT = Path(__file__).resolve().parents[2]
MODEL = "meta-llama/Llama-3.1-8B-Instruct"
FRACTIONS = (0.05, 0.5, 0.9999, 1.0)
# vLLM with chunked prefill off: a budget must be >= max_model_len (the adapter narrows the budgets).
UNCHUNKED = ["--no-enable-chunked-prefill", "--max-model-len", "4096"]
BATCH_KNOBS = (MAX_BATCHED_TOKENS, MAX_RUNNING)
# extraArgs the validation accepts and the engines' parsers must accept too (and what each sets).
# Secret-bearing flags (--api-key) are refused by validation on purpose (spec.apiKeySecret instead),
# so they are not here; --served-model-name a b keeps a several-values spelling in the check.
ACCEPTED: dict[str, list[tuple[list[str], dict[str, Any]]]] = {
    "vllm": [
        (["--disable-chunked-prefill"], {"enable_chunked_prefill": False}),
        (["--enable-chunked-prefill"], {"enable_chunked_prefill": True}),
        (["--kv-cache-dtype", "fp8"], {"kv_cache_dtype": "fp8"}),
        (["--max-model-len", "8192"], {"max_model_len": 8192}),
        (["--quantization", "fp8"], {"quantization": "fp8"}),
        (["--dtype", "bfloat16"], {"dtype": "bfloat16"}),
        (["--enforce-eager"], {"enforce_eager": True}),
        (["--kv-offloading-size", "8", "--kv-offloading-backend", "native"], {"kv_offloading_size": 8.0}),
        (["--prefix-caching-hash-algo", "xxhash"], {"prefix_caching_hash_algo": "xxhash"}),
        (["--served-model-name", "a", "b"], {"served_model_name": ["a", "b"]}),
        (["--trust-remote-code"], {"trust_remote_code": True}),
        (["--uvicorn-log-level", "warning"], {"uvicorn_log_level": "warning"}),
    ],
    "sglang": [
        (["--context-length", "8192"], {"context_length": 8192}),
        (["--kv-cache-dtype", "fp8_e4m3"], {"kv_cache_dtype": "fp8_e4m3"}),
        (["--cuda-graph-max-bs-decode", "64"], {"cuda_graph_max_bs_decode": 64}),
        (["--cuda-graph-max-bs-prefill", "4096"], {"cuda_graph_max_bs_prefill": 4096}),
        (["--enable-hierarchical-cache", "--hicache-ratio", "2"], {"enable_hierarchical_cache": True}),
        (["--radix-eviction-policy", "lfu"], {"radix_eviction_policy": "lfu"}),
        (["--log-level", "warning"], {"log_level": "warning"}),
        (["--disable-cuda-graph"], {"disable_cuda_graph": True}),
        (["--enable-priority-scheduling"], {"enable_priority_scheduling": True}),
        (["--trust-remote-code"], {"trust_remote_code": True}),
    ],
}


# The SLO targets the knob cases render with; SGLang's histograms take them as bounds.
TTFT_SLO_S, ITL_SLO_S = 0.05, 0.15


def metric_sets(engine: str) -> dict[str, Any]:
    """What SGLang's parser must read of the histogram bounds prefixtune renders."""
    if engine != "sglang":
        return {}
    return {
        "bucket_time_to_first_token": list(ttft_buckets(TTFT_SLO_S)),
        "bucket_inter_token_latency": list(itl_buckets(ITL_SLO_S)),
    }


def knob_cases(engine: str) -> list[dict[str, Any]]:
    adapter = get_adapter(engine)
    knobs = adapter.knobs()
    out = []
    for fraction, block, caching, policy, tp in itertools.product(
        FRACTIONS,
        knobs["block_size"].choices,
        knobs["prefix_caching"].choices,
        knobs["schedule_policy"].choices,
        (1, 2),
    ):
        config = KnobConfig(float(fraction), int(block), bool(caching), str(policy))  # type: ignore[arg-type]
        rendered = adapter.render(
            MODEL, config, tensor_parallel=tp, ttft_slo_s=TTFT_SLO_S, itl_slo_s=ITL_SLO_S
        )
        out.append(
            {
                "engine": engine,
                "source": "knobs",
                "argv": list(rendered.argv),
                "expect": expect(config, tp, engine),
                "sets": metric_sets(engine),
            }
        )
    return out


def batch_values(engine: str, knob: str) -> list[int]:
    """What a space can search for a batch limit (its ladder) and the engine default (0), then the
    ends of the knob's valid range."""
    spec = get_adapter(engine).knobs()[knob]
    assert spec.low is not None and spec.high is not None
    ends = [int(spec.low), int(spec.high)]
    return [ENGINE_DEFAULT, *(int(c) for c in spec.choices), *(e for e in ends if e not in spec.choices)]


def batch_cases(engine: str) -> tuple[list[dict[str, Any]], list[dict[str, Any]]]:
    """Every (token budget, running cap) pair of the two knobs' values, rendered where the adapter
    allows it (cases) and recorded where it refuses it (the engine must refuse those too)."""
    adapter = get_adapter(engine)
    variants: list[list[str]] = [[], UNCHUNKED] if engine == "vllm" else [[]]
    cases, refused = [], []
    for extra in variants:
        allowed = adapter.allowed_choices(extra).get(MAX_BATCHED_TOKENS)
        for tokens, running in itertools.product(
            batch_values(engine, MAX_BATCHED_TOKENS), batch_values(engine, MAX_RUNNING)
        ):
            config = adapter.default_config().with_(max_batched_tokens=tokens, max_running=running)
            source = f"batch limits {tokens}/{running}{' ' + ' '.join(extra) if extra else ''}"
            narrowed = allowed is not None and not adapter.knobs()[MAX_BATCHED_TOKENS].allows(tokens, allowed)
            try:
                if narrowed:
                    raise ArgsError("refused with these extra args")
                rendered = adapter.render(MODEL, config, extra)
            except ArgsError as err:
                refused.append(
                    {
                        "engine": engine,
                        "source": source,
                        "scheduler": {
                            "max_num_batched_tokens": tokens,
                            "max_num_seqs": running,
                            "enable_chunked_prefill": not extra,
                            "max_model_len": 4096,
                        },
                        "why": str(err),
                    }
                )
                continue
            case = {"engine": engine, "source": source, "argv": list(rendered.argv)}
            case["expect"] = expect(config, 1, engine)
            if engine == "vllm" and tokens and running:  # vLLM's SchedulerConfig must accept the pair
                case["scheduler"] = {
                    "max_num_batched_tokens": tokens,
                    "max_num_seqs": running,
                    "enable_chunked_prefill": not extra,
                    "max_model_len": 4096,
                }
            cases.append(case)
    return cases, refused


def expect(config: KnobConfig, tp: int, engine: str) -> dict[str, Any]:
    """What the engine's parser must read. A batch limit at the engine default is not rendered:
    vLLM's EngineArgs then holds None (its default is resolved later, by device); SGLang resolves its
    own at once, so nothing is expected of it there."""
    wanted: dict[str, Any] = {
        "memory_fraction": config.memory_fraction,
        "block_size": config.block_size,
        "prefix_caching": config.prefix_caching,
        "schedule_policy": config.schedule_policy,
        "tensor_parallel": tp,
    }
    for knob in BATCH_KNOBS:
        value = config.get(knob)
        if value != ENGINE_DEFAULT:
            wanted[knob] = value
        elif engine == "vllm":
            wanted[knob] = None
    return wanted


def extra_arg_cases(engine: str) -> list[dict[str, Any]]:
    adapter = get_adapter(engine)
    out = []
    for args, sets in ACCEPTED[engine]:
        _, errors = validate_spec({"engine": engine, "model": MODEL, "extraArgs": args})
        if errors:
            raise SystemExit(f"{engine} {args}: prefixtune's validation refuses it: {errors}")
        config = adapter.default_config()
        rendered = adapter.render(MODEL, config, args)
        out.append(
            {
                "engine": engine,
                "source": f"extraArgs {' '.join(args)}",
                "argv": list(rendered.argv),
                "expect": expect(config, 1, engine),
                "sets": sets,
            }
        )
    return out


def routing_cases() -> list[dict[str, Any]]:
    """vLLM's command under each routing policy: the scale-out endpoints (the render routes
    vllm-router routes on) on whenever a router may be in front, off under kube-proxy, each read by
    vLLM's own parser."""
    adapter = get_adapter("vllm")
    out = []
    for policy in (AUTO_POLICY, *(p.value for p in RoutingPolicy)):
        config = adapter.default_config().with_(routing_policy=policy)
        rendered = adapter.render(MODEL, config)
        out.append(
            {
                "engine": "vllm",
                "source": f"routing {policy}",
                "argv": list(rendered.argv),
                "expect": expect(config, 1, "vllm"),
                "sets": {"enable_scale_out": policy != RoutingPolicy.KUBE_PROXY.value},
            }
        )
    return out


def example_cases() -> list[dict[str, Any]]:
    out = []
    for path in sorted((ROOT / "examples").glob("*.yaml")):
        for doc in yaml.safe_load_all(path.read_text()):
            if not isinstance(doc, dict) or doc.get("kind") != "ServingDeployment":
                continue
            spec = parse_spec(doc["spec"])
            owner = R.Owner(namespace="default", name=str(doc["metadata"]["name"]), uid="contract")
            dep = R.render_deployment(owner, spec, spec.knob_config(), "baseline", spec.replicas)
            (container,) = dep["spec"]["template"]["spec"]["containers"]
            out.append(
                {
                    "engine": str(spec.engine),
                    "source": f"examples/{path.name}",
                    "argv": [*container["command"], *container["args"]],
                    "expect": expect(spec.knob_config(), spec.gpu.count, str(spec.engine)),
                }
            )
    return out


def twin_vllm_families() -> dict[str, Any]:
    """The twin's vLLM exposition and the recipe's names (step 3 compares them with vLLM's own)."""
    from prometheus_client.parser import text_string_to_metric_families

    from prefixtune.metrics.recipe import for_engine
    from prefixtune.twin.engine import TwinEngine
    from prefixtune.twin.exporter import EngineExporter
    from prefixtune.twin.run import parse_command
    from prefixtune.twin.workloads import generate

    parsed = parse_command("vllm", [], model=MODEL)
    exporter = EngineExporter("vllm", MODEL, parsed=parsed)
    eng = TwinEngine(parsed, "H100-80GB", 1, exporter)
    exporter.bind(eng.gauges, lambda: eng.cache.stats)
    eng.submit_all(generate("chatbot", rate=2.0, duration_s=5.0, seed=1))
    eng.advance(float("inf"))
    families = {}
    for fam in text_string_to_metric_families(exporter.render().decode()):
        labels = sorted({k for s in fam.samples for k in s.labels if k != "le"})
        buckets = sorted(
            {float(s.labels["le"]) for s in fam.samples if "le" in s.labels and s.labels["le"] != "+Inf"}
        )
        families[fam.name] = {"type": fam.type, "labels": labels, "buckets": buckets}
    r = for_engine("vllm")
    read = {t.name for t in r.counters()} | set(r.gauges()) | set(r.histograms())
    names = get_adapter("vllm").metrics
    read.add(names.config_info)
    return {"twin": families, "recipe": sorted(read)}


def engine_sets(batch_refused: list[dict[str, Any]]) -> dict[str, Any]:
    """Value sets the adapters offer, for step 2 to compare with the engines' own (and the command
    lines the adapters refuse, which the engines must refuse too)."""
    from prefixtune.engines.sglang import CACHE_AWARE_POLICIES

    vllm = get_adapter("vllm").table.by_dest("quantization")
    quantization = [q for q in REAL_QUANTIZATION_PROBE if _accepts(vllm.convert, q)]
    sglang = get_adapter("sglang")
    return {
        "vllm_quantization": quantization,
        "sglang_policies": list(sglang.knobs()["schedule_policy"].choices),
        "sglang_cache_aware": sorted(CACHE_AWARE_POLICIES),
        "refused": [
            {"engine": "vllm", "quantization": "bitsandbytes"},
            {"engine": "vllm", "quantization": "gguf"},
            {"engine": "sglang", "argv": ["--model-path", MODEL, "--cuda-graph-max-bs", "64"]},
        ],
        # (vLLM) batch-limit pairs the adapter refuses: vLLM's SchedulerConfig must refuse them too.
        "batch_refused": [r for r in batch_refused if r["engine"] == "vllm"],
    }


# Every value vLLM 0.33's QuantizationMethods has plus the two prefixtune refuses (the check compares
# the accepted subset with vLLM's own list).
REAL_QUANTIZATION_PROBE = (
    "awq", "auto_awq", "fp8", "fbgemm_fp8", "fp_quant", "modelopt", "modelopt_fp4", "modelopt_mxfp8",
    "modelopt_mixed", "auto_gptq", "gptq", "gptq_marlin", "awq_marlin", "humming", "compressed-tensors",
    "experts_int8", "quark", "moe_wna16", "torchao", "inc", "mxfp4", "gpt_oss_mxfp4", "deepseek_v4_fp8",
    "online", "fp8_per_tensor", "fp8_per_block", "fp8_per_channel", "int8_per_channel_weight_only",
    "nvfp4_per_token", "mxfp8", "bitsandbytes", "gguf",
)  # fmt: skip


def _accepts(convert: Any, value: str) -> bool:
    try:
        convert(value)
    except ValueError:
        return False
    return True


def main() -> int:
    cases = [*knob_cases("vllm"), *knob_cases("sglang"), *extra_arg_cases("vllm"), *extra_arg_cases("sglang")]
    refused: list[dict[str, Any]] = []
    for engine in ("vllm", "sglang"):
        batch, no = batch_cases(engine)
        cases += batch
        refused += no
    unexplained = [r for r in refused if r["engine"] != "vllm"]
    if unexplained:
        raise SystemExit(f"the adapter refuses batch limits no engine rule explains: {unexplained[:3]}")
    cases += routing_cases()
    cases += example_cases()
    document = {"cases": cases, "vllm_metrics": twin_vllm_families(), "sets": engine_sets(refused)}
    Path(sys.argv[1]).write_text(json.dumps(document))
    print(f"{len(cases)} command lines", file=sys.stderr)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
