"""Cache-only replay: what hit rate would this engine's prefix cache give this traffic at this pool size?

No timing and no batching: requests one at a time in arrival order; each is admitted (its prompt
matched against the cache and blocks allocated for the whole prompt), committed (its full blocks
become cached) and released. The counters are the engine's own (``KVCache.stats``), so the token
hit rate is what the engine's Prometheus counters would show for this traffic with an idle server.

``prefixtune twin cache`` is the CLI (dispatched by ``prefixtune.twin.cli``).
"""

from __future__ import annotations

import argparse
import gc
import json
import sys
import time
from collections.abc import Iterable, Sequence

from prefixtune.engines.base import BLOCK_SIZE
from prefixtune.engines.registry import get_adapter
from prefixtune.twin.cache import make_cache
from prefixtune.twin.models.base import known, twin_model
from prefixtune.twin.prompt import TokenSeq
from prefixtune.twin.request import Request

# The engines' default block sizes (reference/engines.md §1, calibration B4).


def _prompts(items: Iterable[Request | TokenSeq]) -> list[tuple[TokenSeq, int]]:
    """(seq, prompt_len) in arrival order; a bare TokenSeq is all prompt."""
    reqs: list[tuple[float, int, TokenSeq, int]] = []
    for i, item in enumerate(items):
        if isinstance(item, Request):
            reqs.append((item.arrival_s, i, item.seq, item.prompt_len))
        elif isinstance(item, TokenSeq):
            if item.length < 1:
                raise ValueError(f"item {i}: an empty TokenSeq has no prompt")
            reqs.append((0.0, i, item, item.length))
        else:
            raise TypeError(f"item {i}: expected a Request or a TokenSeq, got {type(item).__name__}")
    reqs.sort(key=lambda r: (r[0], r[1]))  # stable: equal arrival times keep their order
    return [(seq, p) for _, _, seq, p in reqs]


def replay_cache(
    engine: str,
    requests_or_seqs: Iterable[Request | TokenSeq],
    pool_tokens: int,
    block_size: int,
    *,
    prefix_caching: bool = True,
    **engine_options: object,
) -> dict[str, object]:
    """Replay prompts through ``engine``'s cache model with a pool of ``pool_tokens`` tokens.

    Returns plain Python values: engine, block_size, pool_tokens, num_blocks, requests (replayed),
    rejected (prompts larger than the whole pool, skipped), prompt_tokens, hit_tokens,
    token_hit_rate (hit tokens / prompt tokens as the engine counts), block_hit_rate (hit full
    blocks / full blocks of the prompts), host_hit_tokens, evicted_blocks, wall_seconds, requests_per_s.
    """
    if isinstance(pool_tokens, bool) or not isinstance(pool_tokens, int) or pool_tokens < 1:
        raise ValueError(f"pool_tokens must be a positive integer, got {pool_tokens!r}")
    if isinstance(block_size, bool) or not isinstance(block_size, int) or block_size < 1:
        raise ValueError(f"block_size must be a positive integer, got {block_size!r}")
    num_blocks = pool_tokens // block_size
    if num_blocks < 1:
        raise ValueError(f"pool_tokens ({pool_tokens}) must hold at least one block of {block_size} tokens")
    cache = make_cache(engine, num_blocks, block_size, prefix_caching, **engine_options)
    prompts = _prompts(requests_or_seqs)
    t0 = time.perf_counter()
    replayed = rejected = 0
    full_blocks = hit_full_blocks = 0
    # The cache models hold many long-lived objects and make almost no cyclic garbage; the cyclic
    # collector's repeated full scans would double the replay time.
    gc_was_enabled = gc.isenabled()
    gc.disable()
    try:
        for i, (seq, p) in enumerate(prompts):
            match = cache.admit(i, seq, p, p, 0.0)
            if match is None:  # larger than the pool even with everything evicted
                rejected += 1
                continue
            cache.commit(i, p, 0.0)
            cache.release(i, 0.0)
            replayed += 1
            full_blocks += p // block_size
            hit_full_blocks += match.hit_tokens // block_size
    finally:
        if gc_was_enabled:
            gc.enable()
    wall = time.perf_counter() - t0
    st = cache.stats
    return {
        "engine": str(twin_model(engine).name),
        "block_size": int(block_size),
        "pool_tokens": int(pool_tokens),
        "num_blocks": int(num_blocks),
        "prefix_caching": bool(prefix_caching),
        "options": {k: v for k, v in engine_options.items() if v is not None},
        "requests": int(replayed),
        "rejected": int(rejected),
        "prompt_tokens": int(st.query_tokens),
        "hit_tokens": int(st.hit_tokens),
        "token_hit_rate": float(st.hit_tokens / st.query_tokens) if st.query_tokens else 0.0,
        "block_hit_rate": float(hit_full_blocks / full_blocks) if full_blocks else 0.0,
        "host_hit_tokens": int(st.host_hit_tokens),
        "evicted_blocks": int(st.evicted_blocks),
        "wall_seconds": float(wall),
        "requests_per_s": float(replayed / wall) if wall > 0 else 0.0,
    }


# -- CLI ---------------------------------------------------------------------------------------


def _positive_int(text: str) -> int:
    try:
        value = int(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"expected a positive integer, got {text!r}") from None
    if value < 1:
        raise argparse.ArgumentTypeError(f"expected a positive integer, got {text!r}")
    return value


def _parser() -> argparse.ArgumentParser:
    ap = argparse.ArgumentParser(
        prog="prefixtune twin cache",
        description="Cache-only replay: an engine's prefix-cache hit rate for a trace or workload at a "
        "pool size (requests one at a time, no timing).",
    )
    ap.add_argument("--engine", required=True, choices=list(known()))
    src = ap.add_mutually_exclusive_group(required=True)
    src.add_argument("--trace", metavar="FILE", help="Mooncake JSONL trace")
    src.add_argument("--workload", metavar="NAME", help="workload preset name or workload file")
    ap.add_argument("--requests", type=_positive_int, metavar="N", help="replay only the first N requests")
    ap.add_argument("--seed", type=int, default=0, help="workload seed (default 0)")
    ap.add_argument(
        "--pool-tokens", type=_positive_int, required=True, metavar="N", help="KV pool size in tokens"
    )
    ap.add_argument(
        "--block-size",
        type=_positive_int,
        metavar="B",
        help="block/page size in tokens (default: the engine's, vllm 16, sglang 1, trtllm 32)",
    )
    ap.add_argument(
        "--no-prefix-caching", action="store_true", help="prefix caching / radix cache / block reuse off"
    )
    ap.add_argument("--eviction-policy", choices=["lru", "lfu"], help="sglang only")
    ap.add_argument("--no-partial-reuse", action="store_true", help="trtllm only: enable_partial_reuse false")
    ap.add_argument(
        "--host-cache-tokens", type=int, metavar="N", help="trtllm only: host tier size in tokens"
    )
    ap.add_argument("--json", action="store_true", help="print the result as JSON")
    return ap


def _load(args: argparse.Namespace) -> list[Request]:
    if args.trace is not None:
        from prefixtune.twin.trace import load_requests

        reqs = load_requests(args.trace)
        return reqs[: args.requests] if args.requests else reqs
    from prefixtune.twin import workloads

    reqs = workloads.generate(args.workload, seed=args.seed)
    if args.requests and len(reqs) < args.requests:
        spec = workloads.resolve_workload(args.workload)
        scale = 1.2 * args.requests / max(len(reqs), 1)
        reqs = workloads.generate(
            args.workload, seed=args.seed, duration_s=float(spec.duration_s or 600) * scale
        )
    return reqs[: args.requests] if args.requests else reqs


def _taking(option: str) -> str:
    """The engines whose cache model takes ``option`` (for the CLI's messages)."""
    return ", ".join(str(name) for name in known() if option in twin_model(name).cache_options)


def cache_main(argv: Sequence[str]) -> int:
    ap = _parser()
    args = ap.parse_args(list(argv))
    engine = args.engine
    accepted = twin_model(engine).cache_options
    opts: dict[str, object] = {}
    if args.eviction_policy is not None:
        if "eviction_policy" not in accepted:
            ap.error(f"--eviction-policy applies to --engine {_taking('eviction_policy')} only")
        opts["eviction_policy"] = args.eviction_policy
    if args.no_partial_reuse or args.host_cache_tokens is not None:
        if "partial_reuse" not in accepted or "host_cache_tokens" not in accepted:
            which = _taking("partial_reuse")
            ap.error(f"--no-partial-reuse and --host-cache-tokens apply to --engine {which} only")
        if args.no_partial_reuse:
            opts["partial_reuse"] = False
        if args.host_cache_tokens is not None:
            if args.host_cache_tokens < 0:
                ap.error("--host-cache-tokens must be >= 0")
            opts["host_cache_tokens"] = args.host_cache_tokens
    block_size = args.block_size or int(get_adapter(engine).knobs()[BLOCK_SIZE].default)
    try:
        reqs = _load(args)
        result = replay_cache(
            engine, reqs, args.pool_tokens, block_size, prefix_caching=not args.no_prefix_caching, **opts
        )
    except (ValueError, OSError) as exc:  # TraceError and WorkloadError are ValueErrors
        print(f"prefixtune twin cache: error: {exc}", file=sys.stderr)
        return 2
    result["source"] = args.trace if args.trace is not None else f"workload:{args.workload}"
    if args.json:
        print(json.dumps(result, indent=2, sort_keys=True))
    else:
        print(
            f"{result['engine']} block {result['block_size']} pool {result['pool_tokens']} tokens "
            f"({result['num_blocks']} blocks), {result['requests']} requests"
            + (f" ({result['rejected']} larger than the pool, skipped)" if result["rejected"] else "")
        )
        print(f"token hit rate {result['token_hit_rate']:.4f}  block hit rate {result['block_hit_rate']:.4f}")
        print(f"replay speed {result['requests_per_s']:.0f} requests/s")
    return 0
