"""Bad input (issue #9): hypothesis-fuzzed ServingDeployment specs through the validation path and
through a running operator, and the extraArgs hardening case by case.

The bench (``prefixtune bench reliability``) runs the 1,000 / 100 figures; these run smaller batches.
"""

from __future__ import annotations

from typing import Any

import pytest

from bench import _reliability_fuzz as fuzz
from prefixtune.api import rules
from prefixtune.api.models import MAX_EXTRA_ARG_LENGTH, MAX_EXTRA_ARGS
from prefixtune.api.validation import validate_spec
from prefixtune.engines import get_adapter

# --- the fuzz through validation -------------------------------------------------------------------


def test_validation_fuzz_every_case_is_accepted_and_round_trips_or_rejected_naming_the_field() -> None:
    report = fuzz.fuzz_validation(300, seed=1)
    assert report["specs"] >= 300
    assert report["crashed"] == 0, report["problems"]
    assert report["invariant_violations"] == 0, report["problems"]
    assert report["rejected_without_field"] == 0, report["problems"]
    assert report["rejected_elsewhere"] == 0
    assert report["accepted"] + report["rejected"] == report["specs"]
    # Both outcomes, and the mutation kinds, are exercised; no mutation slips through as valid
    # except an extraArgs value its flag really takes (e.g. --seed -5).
    assert report["accepted"] >= 20 and report["rejected"] >= 150
    kinds = {k.split(":")[0] for k in report["by_kind"]}
    assert kinds >= {"valid", "wrong-type", "out-of-range", "unknown-field", "bad-enum", "engine-knob",
                     "bad-duration", "extra-args", "cross-field", "structure", "null"}  # fmt: skip
    for kind, counts in report["by_kind"].items():
        if kind == "valid":
            assert counts["rejected"] == 0
        elif kind != "extra-args:bad-value":
            assert counts["accepted"] == 0, kind
    assert report["examples"] and all(e["errors"] for e in report["examples"])


def test_the_fuzz_is_deterministic_for_a_seed() -> None:
    first = [c.spec for c in fuzz.live_cases(25, 3)]
    assert first == [c.spec for c in fuzz.live_cases(25, 3)]
    assert first != [c.spec for c in fuzz.live_cases(25, 4)]


def test_the_fuzz_catches_a_validation_that_lets_bad_extra_args_through(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """Without the engine-parser check, accepted specs that the adapter cannot render are reported."""
    monkeypatch.setattr(rules, "_engine_refusals", lambda *a, **k: [])
    report = fuzz.fuzz_validation(200, seed=1)
    assert report["invariant_violations"] > 0
    assert any("unrecognized arguments" in " ".join(p.get("accepted_but", [])) for p in report["problems"])


# --- extraArgs hardening, case by case -------------------------------------------------------------

ATTACKS: list[tuple[str, str, list[str], str, tuple[str, ...]]] = [
    # (name, engine, extraArgs, path, words the message must contain)
    ("owned", "vllm", ["--block-size", "32"], "spec.extraArgs[0]", ("--block-size", "spec.config.blockSize")),
    (
        "owned-eq",
        "vllm",
        ["--gpu-memory-utilization=0.5"],
        "spec.extraArgs[0]",
        ("spec.config.memoryFraction",),
    ),
    ("underscore", "vllm", ["--block_size", "32"], "spec.extraArgs[0]", ("spec.config.blockSize",)),
    ("underscore-eq", "sglang", ["--mem_fraction_static=0.5"], "spec.extraArgs[0]", ("memoryFraction",)),
    (
        "dash-for-underscore",
        "trtllm",
        ["--free-gpu-memory-fraction", "0.5"],
        "spec.extraArgs[0]",
        ("memoryFraction",),
    ),
    ("abbreviation", "sglang", ["--page", "8"], "spec.extraArgs[0]", ("abbreviates --page-size",)),
    ("abbreviation-vllm", "vllm", ["--gpu-mem", "0.5"], "spec.extraArgs[0]", ("abbreviates",)),
    ("negation", "vllm", ["--no-enable-prefix-caching"], "spec.extraArgs[0]", ("prefixCaching",)),
    ("short-tp", "vllm", ["-tp", "2"], "spec.extraArgs[0]", ("spec.gpu.count",)),
    ("model", "sglang", ["--model-path", "x"], "spec.extraArgs[0]", ("spec.model",)),
    ("port", "vllm", ["--max-model-len", "8", "--port=9000"], "spec.extraArgs[2]", ("operator sets it",)),
    ("semicolon", "vllm", ["--seed", "1; rm -rf /"], "spec.extraArgs[1]", ("';'",)),
    ("and-and", "vllm", ["--seed", "1&&id"], "spec.extraArgs[1]", ("'&'",)),
    ("pipe", "sglang", ["--served-model-name", "a|sh"], "spec.extraArgs[1]", ("'|'",)),
    ("backtick", "vllm", ["--seed", "`id`"], "spec.extraArgs[1]", ("'`'",)),
    ("subshell", "trtllm", ["$(id)"], "spec.extraArgs[0]", ("'$'", "'('")),
    ("newline", "vllm", ["--seed", "1\nid"], "spec.extraArgs[1]", ("newline",)),
    ("nul", "vllm", ["--seed", "1\x00"], "spec.extraArgs[1]", ("U+0000",)),
    ("escape", "vllm", ["--served-model-name", "\x1b[2Jx"], "spec.extraArgs[1]", ("U+001B",)),
    ("zero-width", "vllm", ["--block-size\u200b", "32"], "spec.extraArgs[0]", ("U+200B",)),
    ("bidi", "vllm", ["--served-model-name", "a\u202eb"], "spec.extraArgs[1]", ("U+202E",)),
    (
        "too-many",
        "vllm",
        ["--enforce-eager"] * (MAX_EXTRA_ARGS + 1),
        "spec.extraArgs",
        (f"at most {MAX_EXTRA_ARGS}",),
    ),
    (
        "too-long",
        "vllm",
        ["--served-model-name", "x" * (MAX_EXTRA_ARG_LENGTH + 1)],
        "spec.extraArgs[1]",
        (str(MAX_EXTRA_ARG_LENGTH),),
    ),
    (
        "unknown-flag",
        "vllm",
        ["--max-model-len", "8", "--frobnicate", "1"],
        "spec.extraArgs[2]",
        ("unrecognized arguments", "prefixtune args --engine vllm"),
    ),
    ("lookalike-dash", "vllm", ["\u2014block-size", "32"], "spec.extraArgs[0]", ("unrecognized",)),
    ("uppercase", "sglang", ["--PAGE-SIZE", "8"], "spec.extraArgs[0]", ("unrecognized",)),
    ("bad-value", "vllm", ["--max-model-len", "lots"], "spec.extraArgs[0]", ("expected an integer",)),
    ("missing-value", "sglang", ["--context-length"], "spec.extraArgs[0]", ("expected one argument",)),
    ("stray-positional", "trtllm", ["model.bin"], "spec.extraArgs[0]", ("unrecognized",)),
    (
        "repeated-flag-second-bad",
        "vllm",
        ["--max-model-len", "8", "--max-model-len", "x"],
        "spec.extraArgs[2]",
        ("invalid value 'x'",),
    ),
]


@pytest.mark.parametrize(("name", "engine", "args", "path", "words"), ATTACKS, ids=[a[0] for a in ATTACKS])
def test_extra_args_attack_is_rejected_naming_the_item(
    name: str, engine: str, args: list[str], path: str, words: tuple[str, ...]
) -> None:
    spec, errors = validate_spec({"engine": engine, "model": "org/model", "extraArgs": args})
    assert spec is None
    assert [e.path for e in errors] == [path], errors
    for word in words:
        assert word in errors[0].message, errors[0].message


@pytest.mark.parametrize("engine", ["vllm", "sglang", "trtllm"])
def test_every_option_the_adapter_knows_passes_and_renders_verbatim(engine: str) -> None:
    options: tuple[tuple[str, ...], ...] = fuzz.valid_option_args(engine)
    assert len(options) >= 5
    args = [token for item in options[:12] for token in item if token]
    spec, errors = validate_spec({"engine": engine, "model": "org/model", "extraArgs": args})
    assert errors == [] and spec is not None
    adapter = get_adapter(engine)
    rendered = adapter.render(spec.model, spec.knob_config(), spec.extra_args, None, spec.gpu.count)
    assert list(adapter.parse(rendered.argv, rendered.files).extra_args) == args


# --- through a running operator --------------------------------------------------------------------


async def test_live_fuzz_the_operator_answers_every_spec_and_keeps_running() -> None:
    report: dict[str, Any] = await fuzz.fuzz_live(24, seed=0)
    assert report["specs"] == 24
    assert report["operator_crashes"] == 0 and report["operator_alive_after"]
    assert report["stalls"] == 0 and report["handled_valid_after_batch"], report["problems"]
    assert report["rejected_without_field"] == 0 and report["wrong_outcome"] == 0, report["problems"]
    assert report["accepted"] + report["rejected"] == report["specs"]
    assert report["accepted"] >= 1 and report["rejected"] >= 10 and report["updates"] >= 5
    assert report["operator_log_errors"] == 0, report["problems"]
