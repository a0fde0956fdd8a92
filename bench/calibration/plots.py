"""Plots and tables of docs/calibration.md: the twin (fitted, and the old roofline) against
AIConfigurator's reference, per grid case, TTFT by prompt length and TPOT by batch.

    python bench/calibration/plots.py [OUT_DIR]      (default docs/calibration; needs matplotlib)

Writes one PNG per grid case and ``tables.md`` (the before/after tables the page quotes).
"""

from __future__ import annotations

import sys
from pathlib import Path
from typing import Any

import matplotlib

matplotlib.use("Agg")
import matplotlib.pyplot as plt

from prefixtune.engines.base import EngineName
from prefixtune.twin.calibration import GRID_CASES, GRID_CTX, Point, load_points, ratios, report

COLORS = {"trtllm": "tab:green", "vllm": "tab:blue", "sglang": "tab:red"}


def _slug(case: tuple[str, str, str, int]) -> str:
    m, g, kv, tp = case
    return f"{m}-{g}-kv-{kv}-tp{tp}".lower()


def plot_case(points: list[Point], case: tuple[str, str, str, int], out: Path) -> None:
    fig, axes = plt.subplots(1, 1 + len(GRID_CTX), figsize=(16, 3.8))
    mine = [p for p in points if p.grid and (p.model, p.gpu, p.kv, p.tp) == case]
    fitted = dict(ratios(mine))
    roof = dict(ratios(mine, roofline=True))
    for eng in EngineName:
        e = eng.value
        ttft = sorted((p for p in mine if p.engine == e and p.kind == "ttft"), key=lambda p: p.tokens)
        if ttft:
            xs = [p.tokens for p in ttft]
            ax = axes[0]
            ax.plot(xs, [p.ref_ms for p in ttft], "-", color=COLORS[e], label=f"{e} reference")
            ax.plot(xs, [p.ref_ms * fitted[p] for p in ttft], "o", color=COLORS[e], ms=4, label=f"{e} twin")
            ax.plot(
                xs, [p.ref_ms * roof[p] for p in ttft], ":", color=COLORS[e], label=f"{e} roofline (before)"
            )
        for ax, ctx in zip(axes[1:], GRID_CTX, strict=True):
            tp_ = sorted(
                (p for p in mine if p.engine == e and p.kind == "tpot" and p.tokens == ctx),
                key=lambda p: p.batch,
            )
            if not tp_:
                continue
            xs = [p.batch for p in tp_]
            ax.plot(xs, [p.ref_ms for p in tp_], "-", color=COLORS[e])
            ax.plot(xs, [p.ref_ms * fitted[p] for p in tp_], "o", color=COLORS[e], ms=4)
            ax.plot(xs, [p.ref_ms * roof[p] for p in tp_], ":", color=COLORS[e])
            ax.set_title(f"decode step, context {ctx}")
            ax.set_xlabel("batch")
            ax.set_xscale("log", base=2)
            ax.set_ylabel("ms")
    axes[0].set_title("prefill (TTFT), one prompt")
    axes[0].set_xlabel("prompt tokens")
    axes[0].set_xscale("log", base=2)
    axes[0].set_yscale("log")
    axes[0].set_ylabel("ms")
    axes[0].legend(fontsize=6)
    m, g, kv, tp = case
    fig.suptitle(f"{m} on {g}, KV {kv}, TP{tp}: line = AIConfigurator, dots = twin, dotted = roofline")
    fig.tight_layout()
    fig.savefig(out / f"{_slug(case)}.png", dpi=80)
    plt.close(fig)


def main(argv: list[str]) -> int:
    out = Path(argv[0]) if argv else Path(__file__).resolve().parents[2] / "docs" / "calibration"
    out.mkdir(parents=True, exist_ok=True)
    points = load_points()
    for case in GRID_CASES:
        plot_case(points, case, out)
    (out / "tables.md").write_text(markdown(report(points)))
    print(f"wrote {len(GRID_CASES)} plots and tables.md to {out}")
    return 0


def markdown(rep: dict[str, Any]) -> str:
    """The before/after tables of docs/calibration.md from ``calibration.report``."""
    before, after = rep["roofline"], rep["fitted"]
    lines = [
        "| case | points | roofline median | roofline min-max | fitted median | fitted min-max |",
        "|---|---:|---:|---:|---:|---:|",
    ]
    for name, b in before["per_case"].items():
        a = after["per_case"][name]
        lines.append(
            f"| {name} | {b['points']} | {b['median_abs_err']:.3f} "
            f"| {b['min_ratio']:.2f}-{b['max_ratio']:.2f} "
            f"| {a['median_abs_err']:.3f} | {a['min_ratio']:.2f}-{a['max_ratio']:.2f} |"
        )
    lines += [
        "",
        "| set | points | median abs err | within 15% | within 25% | within 30% | min ratio | max ratio |",
        "|---|---:|---:|---:|---:|---:|---:|---:|",
    ]
    for label, section in (("roofline", before), ("fitted", after)):
        for key in (
            "grid",
            "grid_ttft",
            "grid_tpot",
            "tp2_scaling",
            "fp8_speedup",
            "holdout",
            "prefix_or_batched_prefill",
            "all_points",
        ):
            if key not in section:
                continue
            s = section[key]
            lines.append(
                f"| {label}: {key} | {s['points']} | {s['median_abs_err']:.4f} | {s['within_15']:.1%} "
                f"| {s['within_25']:.1%} | {s['within_30']:.1%} "
                f"| {s['min_ratio']:.3f} | {s['max_ratio']:.3f} |"
            )
    return "\n".join(lines) + "\n"


if __name__ == "__main__":
    raise SystemExit(main(sys.argv[1:]))
