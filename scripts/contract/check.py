"""Step 2 of `make contract` (contract venv: vllm==0.33.0 and sglang==0.5.23 from PyPI).

Runs every command line from step 1 through the engine's own parser, built as its entry point builds
it (vLLM: FlexibleArgumentParser + the serve subcommand of `vllm serve`, CPU platform forced with
VLLM_TARGET_DEVICE=cpu; SGLang: prepare_server_args, what `sglang serve` and launch_server call),
and compares every parsed value with the intended one. Then instantiates vLLM's real
PrometheusStatLogger (on a config-only local model directory: no weights, no network) and records its
families. Usage: python check.py CASES.json OUT.json
"""

from __future__ import annotations

import json
import os
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

os.environ["VLLM_TARGET_DEVICE"] = "cpu"

TOLERANCE = 1e-12


def vllm_parser() -> tuple[Any, dict[str, Any]]:
    import vllm.entrypoints.cli.serve as serve
    from vllm import platforms
    from vllm.utils.argparse_utils import FlexibleArgumentParser

    parser = FlexibleArgumentParser(description="vLLM CLI")
    subparsers = parser.add_subparsers(required=False, dest="subparser")
    cmds = {}
    for cmd in serve.cmd_init():
        cmd.subparser_init(subparsers).set_defaults(dispatch_function=cmd.cmd)
        cmds[cmd.name] = cmd
    return parser, {"cmds": cmds, "platform": type(platforms.current_platform).__name__}


def check_vllm(parser: Any, cmds: dict[str, Any], case: dict[str, Any]) -> list[str]:
    from vllm.engine.arg_utils import EngineArgs

    argv = case["argv"]
    assert argv[:2] == ["vllm", "serve"], argv[:2]
    args = parser.parse_args(argv[1:])
    cmds[args.subparser].validate(args)
    if getattr(args, "model_tag", None) is not None:  # what ServeSubcommand.cmd does
        args.model = args.model_tag
    engine = EngineArgs.from_cli_args(args)
    got = {
        "memory_fraction": engine.gpu_memory_utilization,
        "block_size": engine.block_size,
        "prefix_caching": engine.enable_prefix_caching,
        "schedule_policy": engine.scheduling_policy,
        "tensor_parallel": engine.tensor_parallel_size,
        "max_batched_tokens": engine.max_num_batched_tokens,
        "max_running": engine.max_num_seqs,
    }
    problems = compare(case["expect"], got)
    if case.get("scheduler"):
        problems += vllm_scheduler(case["scheduler"], refused=False)
    for key, value in (case.get("sets") or {}).items():
        have = getattr(engine, key, getattr(args, key, None))
        if have != value:
            problems.append(f"{key}: intended {value!r}, parsed {have!r}")
    return problems


def check_sglang(case: dict[str, Any]) -> list[str]:
    from sglang.srt.server_args import prepare_server_args

    argv = case["argv"]
    head = 2 if argv[:2] == ["sglang", "serve"] else 3
    assert argv[:head] in (["sglang", "serve"], ["python3", "-m", "sglang.launch_server"]), argv[:head]
    args = prepare_server_args(argv[head:])
    got = {
        "memory_fraction": args.mem_fraction_static,
        "block_size": args.page_size,
        "prefix_caching": not args.disable_radix_cache,
        "schedule_policy": args.schedule_policy,
        "tensor_parallel": args.tp_size,
        "max_batched_tokens": args.chunked_prefill_size,
        "max_running": args.max_running_requests,
    }
    problems = compare(case["expect"], got)
    if not args.enable_metrics:
        problems.append("enable_metrics: intended True, parsed False")
    for key, value in (case.get("sets") or {}).items():
        if getattr(args, key, None) != value:
            problems.append(f"{key}: intended {value!r}, parsed {getattr(args, key, None)!r}")
    return problems


# How many batch-limit pairs went through vLLM's SchedulerConfig, by what prefixtune expects of it.
SCHEDULER_CHECKS = {"accepted": 0, "refused": 0}


def vllm_scheduler(values: dict[str, Any], refused: bool) -> list[str]:
    """vLLM's own SchedulerConfig on a pair of batch limits (its start-up checks: budget >= running
    cap, and >= max_model_len with chunked prefill off): accepted, or refused when ``refused``."""
    from vllm.config import SchedulerConfig

    SCHEDULER_CHECKS["refused" if refused else "accepted"] += 1
    fields = {k: v for k, v in values.items() if k != "max_model_len"}
    try:
        SchedulerConfig(**fields, max_model_len=values["max_model_len"], is_encoder_decoder=False)
    except Exception as err:
        return [] if refused else [f"vLLM's SchedulerConfig refuses {values}: {err}"]
    return [f"prefixtune refuses {values}, vLLM's SchedulerConfig accepts it"] if refused else []


def compare(expect: dict[str, Any], got: dict[str, Any]) -> list[str]:
    out = []
    for key, want in expect.items():
        have = got[key]
        same = abs(float(have) - float(want)) <= TOLERANCE if key == "memory_fraction" else have == want
        if not same or (key != "memory_fraction" and type(have) is not type(want)):
            out.append(f"{key}: intended {want!r}, parsed {have!r}")
    return out


def check_sets(sets: dict[str, Any], model_dir: str) -> list[str]:
    """The value sets prefixtune offers against the engines' own, and refusals the engines share."""
    from sglang.srt.server_args import prepare_server_args
    from vllm.engine.arg_utils import EngineArgs
    from vllm.model_executor.layers.quantization import DEPRECATED_QUANTIZATION_METHODS, QUANTIZATION_METHODS

    problems = []
    real = set(QUANTIZATION_METHODS) - set(DEPRECATED_QUANTIZATION_METHODS)
    offered = set(sets["vllm_quantization"])
    if offered != real:
        problems.append(
            f"vLLM --quantization: prefixtune offers {sorted(offered - real)} vLLM lacks, "
            f"lacks {sorted(real - offered)}"
        )
    cache_aware, agnostic = sglang_policy_enums()
    policies = cache_aware | agnostic
    if not set(sets["sglang_policies"]) <= policies:
        problems.append(f"SGLang policies {sorted(set(sets['sglang_policies']) - policies)} do not exist")
    aware = cache_aware & set(sets["sglang_policies"])
    if aware != set(sets["sglang_cache_aware"]):
        problems.append(
            f"SGLang cache-aware policies: engine {sorted(aware)}, prefixtune {sets['sglang_cache_aware']}"
        )
    for refused in sets["refused"]:
        try:
            if refused["engine"] == "vllm":
                EngineArgs(
                    model=model_dir, skip_tokenizer_init=True, quantization=refused["quantization"]
                ).create_model_config()
            else:
                prepare_server_args(refused["argv"])
        except (SystemExit, Exception):
            continue  # refused, as prefixtune refuses it
        problems.append(f"{refused}: prefixtune refuses it, the engine accepts it")
    for refused in sets.get("batch_refused", []):
        if refused["scheduler"]["max_num_batched_tokens"] and refused["scheduler"]["max_num_seqs"]:
            problems += vllm_scheduler(refused["scheduler"], refused=True)
    return problems


def sglang_policy_enums() -> tuple[set[str], set[str]]:
    """The values of SGLang's CacheAwarePolicy and CacheAgnosticPolicy, read from the installed
    schedule_policy.py (importing it pulls torchvision, which this CPU venv does not have)."""
    import ast
    import importlib.util

    spec = importlib.util.find_spec("sglang")
    assert spec is not None and spec.submodule_search_locations
    path = Path(next(iter(spec.submodule_search_locations))) / "srt" / "managers" / "schedule_policy.py"
    values: dict[str, set[str]] = {"CacheAwarePolicy": set(), "CacheAgnosticPolicy": set()}
    for node in ast.parse(path.read_text()).body:
        if isinstance(node, ast.ClassDef) and node.name in values:
            for item in node.body:
                if isinstance(item, ast.Assign) and isinstance(item.value, ast.Constant):
                    values[node.name].add(str(item.value.value))
    return values["CacheAwarePolicy"], values["CacheAgnosticPolicy"]


def tiny_model() -> str:
    """A config-only local model directory (no weights): what vLLM's configs need, no network."""
    model = Path(tempfile.mkdtemp()) / "tiny-llama"
    model.mkdir()
    (model / "config.json").write_text(
        json.dumps(
            {
                "architectures": ["LlamaForCausalLM"],
                "model_type": "llama",
                "hidden_size": 64,
                "intermediate_size": 128,
                "num_attention_heads": 4,
                "num_key_value_heads": 4,
                "num_hidden_layers": 2,
                "vocab_size": 1000,
                "max_position_embeddings": 4096,
                "torch_dtype": "bfloat16",
            }
        )
    )
    return str(model)


def vllm_metrics(model: str) -> dict[str, Any]:
    """vLLM's own PrometheusStatLogger families (name -> type, labels, buckets)."""
    import prometheus_client
    from prometheus_client.parser import text_string_to_metric_families
    from vllm.engine.arg_utils import EngineArgs
    from vllm.v1.metrics.loggers import PrometheusStatLogger

    config = EngineArgs(model=str(model), skip_tokenizer_init=True, max_model_len=4096).create_engine_config()
    config.cache_config.num_gpu_blocks = 1000
    logger = PrometheusStatLogger(config, engine_indexes=[0])
    logger.log_engine_initialized()
    families = {}
    text = prometheus_client.generate_latest(prometheus_client.REGISTRY).decode()
    for fam in text_string_to_metric_families(text):
        if not fam.name.startswith("vllm:"):
            continue
        labels = sorted({k for s in fam.samples for k in s.labels if k != "le"})
        buckets = sorted(
            {float(s.labels["le"]) for s in fam.samples if "le" in s.labels and s.labels["le"] != "+Inf"}
        )
        families[fam.name] = {"type": fam.type, "labels": labels, "buckets": buckets}
    return families


def main() -> int:
    data = json.loads(Path(sys.argv[1]).read_text())
    started = time.time()
    parser, info = vllm_parser()
    results: dict[str, Any] = {"platform": info["platform"], "engines": {}, "failures": []}
    for case in data["cases"]:
        engine = case["engine"]
        if engine == "trtllm":
            stats = results["engines"].setdefault(engine, {"checked": 0, "skipped": 0})
            stats["skipped"] += 1  # no wheel: facts are kept as a table in the docs
            continue
        try:
            problems = check_vllm(parser, info["cmds"], case) if engine == "vllm" else check_sglang(case)
        except SystemExit as err:  # argparse refused it
            problems = [f"the parser exited {err.code}"]
        except Exception as err:
            problems = [f"{type(err).__name__}: {err}"]
        stats = results["engines"].setdefault(engine, {"checked": 0, "failed": 0})
        stats["checked"] += 1
        if problems:
            stats["failed"] += 1
            results["failures"].append({"source": case["source"], "argv": case["argv"], "problems": problems})
    model = tiny_model()
    results["set_problems"] = check_sets(data["sets"], model)
    results["vllm_scheduler_pairs"] = dict(SCHEDULER_CHECKS)
    try:
        results["vllm_metrics"] = vllm_metrics(model)
    except Exception as err:
        results["vllm_metrics_error"] = f"{type(err).__name__}: {err}"
    results["seconds"] = round(time.time() - started, 1)
    Path(sys.argv[2]).write_text(json.dumps(results))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
