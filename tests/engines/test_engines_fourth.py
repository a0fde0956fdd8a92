"""A fourth engine, in the tests only: one adapter (its knobs with their bindings, flags, metrics), one
twin model (memory plan, scheduler defaults and policy names, costs, cache, metric table, serving
quirks) and one registry line each. It passes the same round trips as the real three without any
other source file knowing it: render -> parse -> render, the knob loops, the registry's lookups and
command detection; and the twin runs it: ``simulate`` boots it from its own command line (the pool
from its memory split, the roofline from its overheads, the queue order from its policy alias), its
exporter serves its own series, its cache replays, and its errors take its shape. So what proves the
twin has one home per engine: nothing in ``prefixtune.twin`` names this engine, yet it runs, and it
is unknown again once its twin model is unregistered."""

from __future__ import annotations

from collections.abc import Iterator, Mapping, Sequence
from typing import ClassVar

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
    batch_limit_knob,
    first_labels,
    flag_value,
    knob_table,
    memory_fraction_knob,
    options_from,
    prefix_caching_knob,
    read_labels,
    switch,
    unless_default,
)
from prefixtune.engines.base import (
    BLOCK_SIZE,
    MAX_BATCHED_TOKENS,
    MAX_RUNNING,
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
from prefixtune.engines.knobs import ENGINE_KNOB_NAMES
from prefixtune.twin import models
from prefixtune.twin.cache import KVCache, VllmCache
from prefixtune.twin.catalog import GpuHardware
from prefixtune.twin.exporter import Admitted, EngineExporter, Move, TableMetrics, counter, gauge
from prefixtune.twin.memory import MemoryStart, StartupOOM
from prefixtune.twin.models import SchedulerDefaults, TwinModel
from prefixtune.twin.openai_api import error_body
from prefixtune.twin.replay import replay_cache
from prefixtune.twin.run import SimOptions, simulate
from prefixtune.twin.workloads import generate

STUB = "stubserve"
_METRICS = MetricNames(
    requests_running="stub_running", requests_waiting="stub_waiting", kv_usage="stub_kv",
    prompt_tokens="stub_prompt_total", generation_tokens="stub_generation_total",
    requests_finished="stub_finished_total", ttft="stub_ttft_seconds", itl="stub_itl_seconds",
    tpot="",
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
            Flag("order", ("--order",), role=Role.OWNED, convert=to_choice(("fifo", "longest-output"))),
            Flag("tokens", ("--tokens",), role=Role.OWNED, convert=to_int(1)),
            Flag("batch", ("--batch",), role=Role.OWNED, convert=to_int(1)),
            Flag("seed", ("--seed",), convert=to_int()),
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
            name=SCHEDULE_POLICY, default="fifo", choices=("fifo", "longest-output"), flag="--order",
            binding=Binding(dest="order", render=flag_value("--order")),
        ),
        batch_limit_knob(
            MAX_BATCHED_TOKENS, (1024, 2048, 4096), "--tokens", "tokens per step",
            Binding(dest="tokens", render=unless_default("--tokens")),
        ),
        batch_limit_knob(
            MAX_RUNNING, (16, 32, 64), "--batch", "running requests",
            Binding(dest="batch", render=unless_default("--batch")),
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
        keys = {"batch": MAX_RUNNING, "tokens": MAX_BATCHED_TOKENS, "tp": "tensor_parallel"}
        options = options_from(scan, keys)
        return self.parsed(scan, scan.positionals[0], self.config_from(scan), options)

    def effective_config(self, samples: Sequence[tuple[str, Mapping[str, str], float]]) -> dict[str, object]:
        return read_labels(first_labels(samples, _METRICS.config_info) or {}, self.knob_labels())


def _first(e: Admitted) -> bool:
    return e.first


class StubMetrics(TableMetrics):
    """The stub's metric table: a running gauge and token counters under its own names."""

    table = (
        gauge(_METRICS.requests_running, "running", {}, "running"),
        counter(
            _METRICS.hit_denominator,
            "queried tokens",
            {},
            Move(Admitted, lambda e: e.req.prompt_len, when=_first),
        ),
        counter(
            _METRICS.hit_numerator,
            "cached tokens",
            {},
            Move(Admitted, lambda e: e.match.hit_tokens, when=_first),
        ),
    )


class StubTwin(TwinModel):
    """``stub-serve`` as the twin models it: a fixed memory split, vLLM's block pool, fcfs / lof."""

    name = STUB
    step_overhead_s = 2e-3
    seq_overhead_s = 1e-5
    policy_aliases: ClassVar[Mapping[str, str]] = {"fifo": "fcfs", "longest-output": "lof"}
    owned_by = "stub"
    oom_startup_prefix = "StubOOM"
    error_envelope = True
    metrics = StubMetrics

    def scheduler_defaults(self, gpu: GpuHardware) -> SchedulerDefaults:
        return SchedulerDefaults(max_running=64, max_batched_tokens=4096, chunked_prefill=True)

    def memory_split(self, start: MemoryStart) -> tuple[float, float]:
        left = start.free_at_start - start.weights - start.profile - start.graphs
        if left <= 0:
            raise StartupOOM(f"stub: no memory for KV on {start.gpu_name}")
        return start.fraction * left, start.profile + (1.0 - start.fraction) * left

    def make_cache(
        self, num_blocks: int, block_size: int, prefix_caching: bool, options: Mapping[str, object]
    ) -> KVCache:
        return VllmCache(num_blocks, block_size, prefix_caching)


@pytest.fixture(autouse=True)
def stub_engine() -> Iterator[StubAdapter]:
    adapter = StubAdapter()
    registry.register(adapter)  # the one registry line
    models.register(StubTwin())  # and the twin's
    yield adapter
    registry.unregister(STUB)
    models.unregister(STUB)


def _values(spec: KnobSpec) -> st.SearchStrategy[object]:
    if spec.continuous:
        assert spec.low is not None and spec.high is not None
        return st.floats(spec.low, spec.high, exclude_min=spec.low_exclusive, allow_nan=False)
    if spec.open_range:
        return st.sampled_from((0, *spec.choices))  # 0: the engine's default, not rendered
    return st.sampled_from(spec.choices)


@st.composite
def _commands(draw: st.DrawFn) -> tuple[KnobConfig, tuple[str, ...], int, int]:
    knobs = StubAdapter().knobs()
    config = KnobConfig.from_dict({knob: draw(_values(knobs[knob])) for knob in ENGINE_KNOB_NAMES})
    extra = ("--seed", str(draw(st.integers(-5, 512)))) if draw(st.booleans()) else ()
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
    if config.max_running:
        assert parsed.options["max_running"] == config.max_running
    again = adapter.render(
        parsed.model, parsed.config, parsed.extra_args, parsed.port, parsed.tensor_parallel
    )
    assert again == rendered


def test_a_fourth_engine_renders_each_knob_through_its_binding() -> None:
    adapter = registry.get_adapter(STUB)
    config = KnobConfig(
        memory_fraction=0.5, block_size=16, prefix_caching=False, schedule_policy="longest-output"
    )
    rendered = adapter.render("m", config)
    assert rendered.argv == (
        "stub-serve", "m", "--host", "0.0.0.0", "--port", "9000", "--tp", "1",
        "--mem", "0.5", "--page", "16", "--no-cache", "--order", "longest-output",
    )  # fmt: skip


def test_a_fourth_engine_refuses_what_the_operator_owns_and_bad_values() -> None:
    assert registry.extra_args_errors(STUB, ["--page", "32"]) == [
        f"{STUB}: extraArgs may not set --page: the operator owns it"
    ]
    assert registry.extra_args_errors(STUB, ["--batch", "4"]) == [
        f"{STUB}: extraArgs may not set --batch: the operator owns it"
    ]
    assert registry.extra_args_errors(STUB, ["--seed", "x"]) != []
    assert registry.extra_args_errors(STUB, ["--seed", "4"]) == []
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


M8 = "meta-llama/Llama-3.1-8B-Instruct"


def _stub_run(config: KnobConfig, seed: int = 1) -> dict[str, object]:
    adapter = registry.get_adapter(STUB)
    cmd = adapter.render(M8, config.with_(max_running=32))
    requests = generate("chatbot", rate=4.0, duration_s=60.0, seed=seed)
    summary = simulate(STUB, cmd.argv, "H100-80GB", requests, SimOptions(seed=seed, warmup_s=10.0))
    return summary.without_wall()


def test_the_twin_runs_a_fourth_engine_from_its_own_model() -> None:
    base = KnobConfig(memory_fraction=0.8, block_size=16, prefix_caching=True, schedule_policy="fifo")
    run = _stub_run(base)
    assert run["status"] == "ok" and run["finished"] > 100
    setup = run["setup"]
    assert isinstance(setup, dict) and setup["engine"] == STUB
    assert setup["cost_source"] == "roofline"  # no fitted data for it: the model's overheads
    assert 0.0 < run["hit_rate"] < 1.0  # the chatbot's shared prefixes hit its (vLLM) block pool
    assert run["max_running"] <= 32  # --batch: the running cap knob, read as the max_running option
    # its memory split: a larger fraction, a larger pool; the cache off, no hits
    bigger = _stub_run(base.with_(memory_fraction=0.95))
    assert bigger["kv_pool_tokens"] > run["kv_pool_tokens"]
    assert _stub_run(base.with_(prefix_caching=False))["hit_rate"] == 0.0
    # its own policy name maps onto the twin's longest-output-first order: another schedule
    assert _stub_run(base.with_(schedule_policy="longest-output")) != run


def test_a_fourth_engine_exports_its_own_series_replays_and_errs_in_its_shape() -> None:
    from prefixtune.twin.engine import TwinEngine
    from prefixtune.twin.run import parse_command

    parsed = parse_command(STUB, [], model=M8)
    exporter = EngineExporter(STUB, M8, parsed=parsed, start_time=0.0)
    engine = TwinEngine(parsed, "H100-80GB", 0, exporter)
    exporter.bind(engine.gauges)
    for req in generate("chatbot", rate=4.0, duration_s=20.0, seed=2):
        engine.submit(req)
    engine.advance(10.0)
    text = exporter.render().decode()
    assert f"{_METRICS.requests_running} " in text and f"{_METRICS.hit_denominator} " in text
    assert "vllm:" not in text and "sglang:" not in text and "trtllm_" not in text
    replay = replay_cache(STUB, generate("rag", seed=5, duration_s=30.0), 100_000, 16)
    assert replay["engine"] == STUB and replay["requests"] > 0
    assert error_body(STUB, "bad", 400) == {
        "error": {"message": "bad", "type": "BadRequestError", "param": None, "code": 400}
    }


def test_without_its_twin_model_the_twin_does_not_know_the_fourth_engine() -> None:
    models.unregister(STUB)
    base = KnobConfig(memory_fraction=0.8, block_size=16, prefix_caching=True, schedule_policy="fifo")
    with pytest.raises(ValueError, match="unknown engine 'stubserve'; known engines: vllm, sglang, trtllm"):
        _stub_run(base)


def test_the_twin_commands_take_the_fourth_engine() -> None:
    import argparse

    from prefixtune.twin.cliargs import add_target_args

    parser = argparse.ArgumentParser()
    add_target_args(parser, model_required=False, tp_default=None)
    assert parser.parse_args(["--engine", STUB, "--gpu", "H100"]).engine == STUB
