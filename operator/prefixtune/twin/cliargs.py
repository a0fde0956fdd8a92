"""Arguments shared by the twin's commands (run, serve, whatif): which engine, model and GPU, and
where the requests come from. One definition, so the commands accept and describe them alike."""

from __future__ import annotations

import argparse

from prefixtune.twin.models import known


def add_target_args(p: argparse.ArgumentParser, *, model_required: bool, tp_default: int | None) -> None:
    """--engine, --model, --gpu, --tp."""
    p.add_argument("--engine", required=True, choices=[str(name) for name in known()])
    if model_required:
        p.add_argument("--model", required=True, help="model (HF name or short name)")
    else:
        p.add_argument(
            "--model", help="model (HF name or short name); optional when a full command follows --"
        )
    p.add_argument("--gpu", required=True, help="GPU type: H100-80GB, H200, A100-80GB (aliases accepted)")
    p.add_argument("--tp", type=int, default=tp_default, help="tensor parallel size (1..2)")


def add_workload_source(p: argparse.ArgumentParser) -> None:
    """Exactly one of --workload, --workload-file, --trace."""
    src = p.add_mutually_exclusive_group(required=True)
    src.add_argument("--workload", help="a workload preset name (rag, chatbot, agent, qa, gsp)")
    src.add_argument("--workload-file", help="a workload file (YAML/JSON)")
    src.add_argument("--trace", help="a Mooncake JSONL trace to replay")
