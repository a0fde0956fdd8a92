"""A fourth engine, in the tests only: one adapter (its knobs with their bindings, flags, metrics) and
one registry line. It passes the same round trips as the real three without any other source file
knowing it: render -> parse -> render, the knob loops, the registry's lookups and command detection."""

from __future__ import annotations

from collections.abc import Iterator, Mapping, Sequence

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from prefixtune.engines import registry
from prefixtune.engines._argv import (
    Flag,
    FlagTable,
    Kind,
    Role,
    format_float,
    to_choice,
    to_float,
    to_int,
    to_text,
)
from prefixtune.engines._common import (
    AdapterBase,
    first_labels,
    flag_value,
    knob_table,
    memory_fraction_knob,
    options_from,
    prefix_caching_knob,
    read_labels,
    switch,
)
from prefixtune.engines.base import (
    BLOCK_SIZE,
    KNOB_NAMES,
    SCHEDULE_POLICY,
    ArgsError,
    Binding,
    EngineName,
    KnobConfig,
    KnobSpec,
    MetricNames,
    ParsedCommand,
    RenderedCommand,
)

STUB = "stubserve"
_METRICS = MetricNames(
    requests_running="stub_running", requests_waiting="stub_waiting", kv_usage="stub_kv",
    prompt_tokens="stub_prompt_total", generation_tokens="stub_generation_total",
    requests_finished="stub_finished_total", ttft="stub_ttft_seconds", itl="stub_itl_seconds",
    e2e="stub_e2e_seconds", preemptions="", hit_numerator="stub_hits_total",
    hit_denominator="stub_queries_total", hit_miss="", hit_unit="tokens", cached_prompt_tokens="",
    config_info="stub_config_info",
)  # fmt: skip


class StubAdapter(AdapterBase):
    """``stub-serve MODEL --mem F --page N --cache/--no-cache --order P``."""

    name = STUB  # type: ignore[assignment]  # not one of EngineName: registered, not built in
    command = ("stub-serve",)
    default_port = 9000
    tp_dest = "tp"
    default_image = "example.com/stub:1"
    version = "1"
    metrics_port = 9000
    metrics_path = "/metrics"
    health_path = "/health"
    metrics = _METRICS
    table = FlagTable(
        [
            Flag("host", ("--host",), role=Role.OWNED, convert=to_text),
            Flag("port", ("--port",), role=Role.OWNED, convert=to_int(1)),
            Flag("tp", ("--tp",), role=Role.OWNED, convert=to_int(1)),
            Flag("mem", ("--mem",), role=Role.OWNED, convert=to_float()),
            Flag("page", ("--page",), role=Role.OWNED, convert=to_int()),
            Flag("cache", ("--cache",), Kind.NEGATABLE, Role.OWNED, negations=("--no-cache",)),
            Flag("order", ("--order",), role=Role.OWNED, convert=to_choice(("fifo", "short"))),
            Flag("batch", ("--batch",), convert=to_int(1)),
        ]
    )
    _knobs = knob_table(
        memory_fraction_knob(
            0.8, "--mem", "share of memory",
            Binding(dest="mem", render=flag_value("--mem", format_float), label="mem"),
        ),
        KnobSpec(
            name=BLOCK_SIZE, default=8, choices=(8, 16, 32), flag="--page",
            binding=Binding(dest="page", render=flag_value("--page"), label="page"),
        ),
        prefix_caching_knob(
            "--cache/--no-cache", "prefix cache",
            Binding(dest="cache", render=switch("--cache", "--no-cache")),
        ),
        KnobSpec(
            name=SCHEDULE_POLICY, default="fifo", choices=("fifo", "short"), flag="--order",
            binding=Binding(dest="order", render=flag_value("--order")),
        ),
    )  # fmt: skip

    def render_args(
        self, model: str, config: KnobConfig, extra_args: Sequence[str], port: int, tensor_parallel: int
    ) -> RenderedCommand:
        args = (model, *self.serving_args(port, tensor_parallel), *self.knob_args(config), *extra_args)
        return RenderedCommand(self.command, args)

    def parse(self, argv: Sequence[str], files: Mapping[str, str] | None = None) -> ParsedCommand:
        scan = self.scan_args(self.command_args(argv), max_positionals=1)
        if not scan.positionals:
            raise ArgsError("stub-serve: MODEL is required")
        options = options_from(scan, {"batch": "max_running", "tp": "tensor_parallel"})
        return self.parsed(scan, scan.positionals[0], self.config_from(scan), options)

    def effective_config(self, samples: Sequence[tuple[str, Mapping[str, str], float]]) -> dict[str, object]:
        return read_labels(first_labels(samples, _METRICS.config_info) or {}, self.knob_labels())


@pytest.fixture(autouse=True)
def stub_engine() -> Iterator[StubAdapter]:
    adapter = StubAdapter()
    registry.register(adapter)  # the one registry line
    yield adapter
    registry.unregister(STUB)


def _values(spec: KnobSpec) -> st.SearchStrategy[object]:
    if spec.continuous:
        assert spec.low is not None and spec.high is not None
        return st.floats(spec.low, spec.high, exclude_min=spec.low_exclusive, allow_nan=False)
    return st.sampled_from(spec.choices)


@st.composite
def _commands(draw: st.DrawFn) -> tuple[KnobConfig, tuple[str, ...], int, int]:
    knobs = StubAdapter().knobs()
    config = KnobConfig.from_dict({knob: draw(_values(knobs[knob])) for knob in KNOB_NAMES})
    extra = ("--batch", str(draw(st.integers(1, 512)))) if draw(st.booleans()) else ()
    return config, extra, draw(st.integers(1, 8)), draw(st.integers(1, 65535))


@settings(max_examples=100, deadline=None)
@given(_commands())
def test_a_fourth_engine_round_trips_render_parse_render(
    drawn: tuple[KnobConfig, tuple[str, ...], int, int],
) -> None:
    config, extra, tp, port = drawn
    adapter = registry.get_adapter(STUB)
    rendered = adapter.render("org/model-7B", config, extra, port=port, tensor_parallel=tp)
    parsed = adapter.parse(rendered.argv, rendered.files)
    assert parsed.config == config
    assert (parsed.model, parsed.port, parsed.tensor_parallel, parsed.extra_args) == (
        "org/model-7B",
        port,
        tp,
        extra,
    )
    assert parsed.options["tensor_parallel"] == tp
    if extra:
        assert parsed.options["max_running"] == int(extra[1])
    again = adapter.render(
        parsed.model, parsed.config, parsed.extra_args, parsed.port, parsed.tensor_parallel
    )
    assert again == rendered


def test_a_fourth_engine_renders_each_knob_through_its_binding() -> None:
    adapter = registry.get_adapter(STUB)
    config = KnobConfig(memory_fraction=0.5, block_size=16, prefix_caching=False, schedule_policy="short")
    rendered = adapter.render("m", config)
    assert rendered.argv == (
        "stub-serve", "m", "--host", "0.0.0.0", "--port", "9000", "--tp", "1",
        "--mem", "0.5", "--page", "16", "--no-cache", "--order", "short",
    )  # fmt: skip


def test_a_fourth_engine_refuses_what_the_operator_owns_and_bad_values() -> None:
    assert registry.extra_args_errors(STUB, ["--page", "32"]) == [
        f"{STUB}: extraArgs may not set --page: the operator owns it"
    ]
    assert registry.extra_args_errors(STUB, ["--batch", "0"]) != []
    assert registry.extra_args_errors(STUB, ["--batch", "4"]) == []
    with pytest.raises(ArgsError, match="block_size"):
        registry.get_adapter(STUB).parse(["stub-serve", "m", "--page", "12"])


def test_a_fourth_engine_is_detected_from_its_command_and_reads_its_config_back() -> None:
    assert registry.detect_engine(["/usr/bin/stub-serve", "m"]) == STUB
    assert registry.detect_engine(["vllm", "serve", "m"]) is EngineName.VLLM
    samples = [("stub_config_info", {"mem": "0.7", "page": "32"}, 1.0)]
    assert registry.get_adapter(STUB).effective_config(samples) == {"memory_fraction": 0.7, "block_size": 32}


def test_without_its_registry_line_the_fourth_engine_is_unknown() -> None:
    registry.unregister(STUB)
    with pytest.raises(ValueError, match="unknown engine 'stubserve'; known engines: vllm, sglang, trtllm"):
        registry.get_adapter(STUB)
