#!/usr/bin/env bash
# The twin's batch-limit curves in docs/batch-limits.md: `prefixtune twin whatif` sweeps, one folder
# per figure under docs/batch-limits/ (the PNG and the results.json it was drawn from).
#   <engine>-budget/  TTFT p50/p99, ITL p99, goodput against the step token budget (long prompts)
#   <engine>-oom/     the (memory fraction x token budget) grid: ok, OOM at start, OOM under load
#   vllm-running/     the same four against the running-request cap (short Q&A, high concurrency)
# Deterministic (seed 0); about 30 s on two cores. PREFIXTUNE and JOBS override the defaults.
set -euo pipefail
cd "$(dirname "$0")/.."
PREFIXTUNE=${PREFIXTUNE:-prefixtune}
JOBS=${JOBS:-2}
OUT=docs/batch-limits
TARGET=(--model meta-llama/Llama-3.1-8B-Instruct --gpu H100-80GB --seed 0 --jobs "$JOBS")
BUDGETS=max_batched_tokens=256,512,1024,2048,4096,8192,16384,32768

whatif() {  # folder, then whatif arguments
  local dir=$OUT/$1
  shift
  rm -rf "$dir"
  $PREFIXTUNE twin whatif "${TARGET[@]}" --out "$dir" "$@" > "$dir.txt.tmp"
  mv "$dir.txt.tmp" "$dir/table.txt"
}

for engine in vllm sglang; do
  whatif "$engine-budget" --engine "$engine" --workload-file "$OUT/long-prompts.yaml" \
    --rate 4 --duration 120 --sweep "$BUDGETS"
done
# TensorRT-LLM leaves chunked prefill off by default: both ways.
whatif trtllm-budget --engine trtllm --workload-file "$OUT/long-prompts.yaml" \
  --rate 4 --duration 120 --sweep "$BUDGETS" --sweep chunked_prefill=false,true
rm "$OUT"/trtllm-budget/whatif_chunked_prefill.png "$OUT"/trtllm-budget/whatif_map_*.png  # not shown
for engine in vllm sglang trtllm; do
  whatif "$engine-oom" --engine "$engine" --workload qa --rate 100 --duration 20 \
    --sweep memory_fraction=0.4,0.5,0.6,0.7,0.8,0.9,0.95,0.97,0.98,0.99 \
    --sweep max_batched_tokens=512,2048,8192,16384,32768,65536
  rm "$OUT/$engine-oom"/whatif_memory_fraction.png "$OUT/$engine-oom"/whatif_max_batched_tokens.png  # the map only
done
whatif vllm-running --engine vllm --workload qa --rate 40 --duration 60 \
  --sweep max_running=4,8,16,32,64,128,256,1024
echo "wrote $OUT/*-budget, *-oom, vllm-running"
