"""What the three adapters share (engines/_common.py): knob tables, render checks, the command head."""

from __future__ import annotations

import pytest

from prefixtune.engines import ArgsError, KnobConfig, KnobSpec, get_adapter
from prefixtune.engines._common import (
    batch_limit_knob,
    first_labels,
    knob_table,
    label_bool,
    label_int,
    label_number,
    memory_fraction_knob,
    prefix_caching_knob,
    read_labels,
    with_kv_tokens,
)
from prefixtune.engines.base import BLOCK_SIZE, KNOB_NAMES, MAX_BATCHED_TOKENS, MAX_RUNNING, SCHEDULE_POLICY

_BLOCK = KnobSpec(name=BLOCK_SIZE, default=16, choices=(16, 32))
_POLICY = KnobSpec(name=SCHEDULE_POLICY, default="fcfs", choices=("fcfs",))
_TOKENS = batch_limit_knob(MAX_BATCHED_TOKENS, (1024, 2048), "--tokens", "doc")
_RUNNING = batch_limit_knob(MAX_RUNNING, (64, 128), "--running", "doc")


def test_knob_table_keys_every_knob_by_name_in_order() -> None:
    fraction = memory_fraction_knob(0.5, "--mem", "doc")
    caching = prefix_caching_knob("--cache", "doc")
    table = knob_table(fraction, _BLOCK, caching, _POLICY, _TOKENS, _RUNNING)
    assert tuple(table) == KNOB_NAMES
    assert table["memory_fraction"] is fraction and table["prefix_caching"] is caching


@pytest.mark.parametrize(
    "specs",
    [
        (_BLOCK, memory_fraction_knob(0.5, "--mem", ""), prefix_caching_knob("--c", ""), _POLICY),
        (memory_fraction_knob(0.5, "--mem", ""), _BLOCK, prefix_caching_knob("--c", "")),
        (memory_fraction_knob(0.5, "--mem", ""), _BLOCK, _BLOCK, _POLICY),
    ],
)
def test_knob_table_refuses_missing_repeated_or_reordered_knobs(specs: tuple[KnobSpec, ...]) -> None:
    with pytest.raises(ValueError, match="knob specs must be memory_fraction, block_size, prefix_caching"):
        knob_table(*specs)


def test_memory_fraction_knob_is_a_share_in_half_open_unit_interval() -> None:
    spec = memory_fraction_knob(0.9, "--mem", "doc")
    assert (spec.name, spec.default, spec.flag, spec.doc) == ("memory_fraction", 0.9, "--mem", "doc")
    assert spec.validate(1.0) is None and spec.validate(0.01) is None
    assert spec.validate(0.0) == "must be in (0.0, 1.0], got 0.0"
    assert spec.validate(1.01) == "must be in (0.0, 1.0], got 1.01"


def test_prefix_caching_knob_is_a_switch_on_by_default() -> None:
    spec = prefix_caching_knob("--cache", "doc")
    assert (spec.name, spec.default, spec.choices, spec.flag) == (
        "prefix_caching",
        True,
        (True, False),
        "--cache",
    )
    assert spec.validate(1) is not None


@pytest.mark.parametrize(
    ("engine", "argv", "message"),
    [
        ("vllm", ["vllm", "run", "m"], "vllm: the command must start with 'vllm serve', got 'vllm run'"),
        ("vllm", [], "vllm: the command must start with 'vllm serve', got ''"),
        (
            "sglang",
            ["python3", "-m", "sglang.serve", "--model-path", "m"],
            "sglang: the command must start with 'sglang serve', got 'python3 -m'",
        ),
        (
            "trtllm",
            ["trtllm-server", "m"],
            "trtllm: the command must start with 'trtllm-serve', got 'trtllm-server'",
        ),
    ],
)
def test_parse_refuses_another_command_naming_the_expected_one(
    engine: str, argv: list[str], message: str
) -> None:
    with pytest.raises(ArgsError) as err:
        get_adapter(engine).parse(argv)
    assert str(err.value) == message


def test_parse_accepts_the_command_aliases() -> None:
    sglang = get_adapter("sglang").parse(["python", "-m", "sglang.launch_server", "--model-path", "m"])
    assert sglang.model == "m"
    trtllm = get_adapter("trtllm").parse(["trtllm-serve", "serve", "m", "--port", "9000", "--tp_size", "2"])
    assert (trtllm.model, trtllm.port, trtllm.tensor_parallel) == ("m", 9000, 2)


@pytest.mark.parametrize("engine", ["vllm", "sglang", "trtllm"])
def test_render_checks_model_then_config_then_extra_args_then_port_then_tp(engine: str) -> None:
    adapter = get_adapter(engine)
    bad = adapter.default_config().with_(block_size=3)
    good = adapter.default_config()

    def message(model: str, config: KnobConfig, extra: list[str], port: int | None, tp: int) -> str:
        with pytest.raises(ArgsError) as err:
            adapter.render(model, config, extra, port, tp)
        return str(err.value)

    assert message("", bad, ["--port", "1"], 0, 0).startswith("model must be a non-empty name")
    assert message("m", bad, ["--port", "1"], 0, 0).startswith(f"{engine}: block_size must be one of")
    assert message("m", good, ["--port", "1"], 0, 0).startswith(f"{engine}: extra args may not set --port")
    assert message("m", good, [], 0, 0) == "port must be an integer in [1, 65535], got 0"
    assert message("m", good, [], None, 0) == "tensor_parallel must be an integer >= 1, got 0"


@pytest.mark.parametrize(("engine", "port"), [("vllm", 8000), ("sglang", 30000), ("trtllm", 8000)])
def test_render_reads_back_with_the_engine_default_port_and_refuses_unknown_extra_flags(
    engine: str, port: int
) -> None:
    adapter = get_adapter(engine)
    rendered = adapter.render("m", adapter.default_config(), (), None, 2)
    parsed = adapter.parse(rendered.argv, rendered.files)
    assert (parsed.model, parsed.port, parsed.tensor_parallel, parsed.extra_args) == ("m", port, 2, ())
    assert parsed.config == adapter.default_config()
    with pytest.raises(ArgsError, match="unrecognized arguments: --no-such-flag"):
        adapter.render("m", adapter.default_config(), ["--no-such-flag"])


def test_first_labels_takes_the_first_sample_of_the_series() -> None:
    samples = [("other", {"a": "0"}, 1.0), ("info", {"a": "1"}, 1.0), ("info", {"a": "2"}, 1.0)]
    assert first_labels(samples, "info") == {"a": "1"}
    assert first_labels(samples, "missing") is None


def test_read_labels_keeps_readable_labels_in_order_and_leaves_out_the_rest() -> None:
    labels = {"blocks": "12.0", "share": "0.5", "on": "False", "bad": "None", "nan": "nan"}
    wanted = (
        ("on", "caching", label_bool),
        ("blocks", "kv_blocks", label_int),
        ("share", "fraction", label_number),
        ("bad", "x", label_int),
        ("nan", "y", label_number),
        ("absent", "z", label_bool),
    )
    found = read_labels(labels, wanted)
    assert list(found.items()) == [("caching", False), ("kv_blocks", 12), ("fraction", 0.5)]
    assert type(found["kv_blocks"]) is int


def test_with_kv_tokens_multiplies_blocks_by_block_size_only_when_both_are_known() -> None:
    assert with_kv_tokens({"kv_blocks": 10, "block_size": 16}) == {
        "kv_blocks": 10,
        "block_size": 16,
        "kv_tokens": 160,
    }
    assert with_kv_tokens({"kv_blocks": 10}) == {"kv_blocks": 10}
    assert with_kv_tokens({"block_size": 16}) == {"block_size": 16}


def test_a_stray_value_after_an_owned_list_flag_is_refused() -> None:
    # SGLang's rendered command ends with --bucket-time-to-first-token VALUES...: a bare "0.9" in the
    # extra args would be read as one more bucket, so render refuses it instead.
    with pytest.raises(ArgsError, match=r"unrecognized arguments: 0\.9"):
        get_adapter("sglang").render("m", get_adapter("sglang").default_config(), ["0.9"])
