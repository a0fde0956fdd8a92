"""render/parse round trip over the whole valid knob space of every engine (hypothesis)."""

from __future__ import annotations

from hypothesis import assume, given, settings
from hypothesis import strategies as st

from prefixtune.engines import EngineAdapter, KnobConfig, get_adapter
from prefixtune.engines.knobs import BY_NAME, ENGINE_KNOB_NAMES

ENGINES = ("vllm", "sglang", "trtllm")

# Valid untuned args per engine, in both flag forms, with the neutral option each one sets.
EXTRA: dict[str, list[tuple[tuple[str, ...], dict[str, object]]]] = {
    "vllm": [
        (("--no-enable-chunked-prefill",), {"chunked_prefill": False}),
        (("--kv-cache-dtype", "fp8_e4m3"), {"kv_cache_dtype": "fp8"}),
        (("--max_model_len=8192",), {"max_model_len": 8192}),
        (("--trust-remote-code",), {}),
        (("--served-model-name", "a", "b"), {}),
        (("--seed", "-3"), {}),
        (("-q", "awq"), {}),
        (("--kv-offloading-size", "2"), {"host_cache_bytes": 2 * 2**30}),
    ],
    "sglang": [
        (("--kv-cache-dtype", "fp8_e5m2"), {"kv_cache_dtype": "fp8"}),
        (("--context-length=32768",), {"max_model_len": 32768}),
        (("--radix-eviction-policy", "lfu"), {"eviction_policy": "lfu"}),
        (("--trust-remote-code",), {}),
        (("--random-seed", "7"), {}),
        (("--enable-hicache", "--hicache-size", "4"), {"host_cache": True, "host_cache_bytes": 4 * 10**9}),
    ],
    "trtllm": [
        (("--enable_chunked_prefill",), {"chunked_prefill": True}),
        (("--kv_cache_dtype", "fp8"), {"kv_cache_dtype": "fp8"}),
        (("--max_seq_len=4096",), {"max_model_len": 4096}),
        (("--trust_remote_code",), {}),
        (("--backend", "pytorch"), {}),
    ],
}


def knob_values(adapter: EngineAdapter, knob: str) -> st.SearchStrategy[object]:
    spec = adapter.knobs()[knob]
    if spec.continuous:
        assert spec.low is not None and spec.high is not None
        return st.floats(spec.low, spec.high, exclude_min=spec.low_exclusive, allow_nan=False)
    if spec.open_range:  # a batch limit: the engine default, a searched value, or any in range
        assert spec.low is not None and spec.high is not None
        anywhere = st.integers(int(spec.low), int(spec.high))
        return st.one_of(st.just(BY_NAME[knob].unset), st.sampled_from(spec.choices), anywhere)
    return st.sampled_from(spec.choices)


@st.composite
def commands(draw: st.DrawFn, engine: str) -> tuple[KnobConfig, tuple[str, ...], dict[str, object], int, int]:
    adapter = get_adapter(engine)
    config = KnobConfig.from_dict({knob: draw(knob_values(adapter, knob)) for knob in ENGINE_KNOB_NAMES})
    assume(not adapter.validate(config))  # vLLM: token budget >= running cap
    indices = draw(st.lists(st.integers(0, len(EXTRA[engine]) - 1), max_size=4, unique=True))
    picked = [EXTRA[engine][i] for i in indices]
    extra: tuple[str, ...] = tuple(token for tokens, _ in picked for token in tokens)
    expected: dict[str, object] = {}
    for _, options in picked:
        expected.update(options)
    return config, extra, expected, draw(st.integers(1, 8)), draw(st.integers(1, 65535))


def check_round_trip(
    engine: str, drawn: tuple[KnobConfig, tuple[str, ...], dict[str, object], int, int]
) -> None:
    config, extra, expected, tp, port = drawn
    adapter = get_adapter(engine)
    rendered = adapter.render("org/model-7B", config, extra, port=port, tensor_parallel=tp)
    parsed = adapter.parse(rendered.argv, rendered.files)
    assert parsed.config == config
    assert parsed.model == "org/model-7B"
    assert parsed.port == port
    assert parsed.tensor_parallel == tp
    assert parsed.options["tensor_parallel"] == tp
    assert parsed.extra_args == extra
    for key, value in expected.items():
        assert parsed.options[key] == value, key
    for knob in ("max_batched_tokens", "max_running"):  # the twin reads the batch limits as options
        value = getattr(config, knob)
        if value > 0:
            assert parsed.options[knob] == value, knob
    again = adapter.render(
        parsed.model, parsed.config, parsed.extra_args, parsed.port, parsed.tensor_parallel
    )
    assert again == rendered


@settings(max_examples=150, deadline=None)
@given(commands("vllm"))
def test_vllm_round_trip(drawn: tuple[KnobConfig, tuple[str, ...], dict[str, object], int, int]) -> None:
    check_round_trip("vllm", drawn)


@settings(max_examples=150, deadline=None)
@given(commands("sglang"))
def test_sglang_round_trip(drawn: tuple[KnobConfig, tuple[str, ...], dict[str, object], int, int]) -> None:
    check_round_trip("sglang", drawn)


@settings(max_examples=150, deadline=None)
@given(commands("trtllm"))
def test_trtllm_round_trip(drawn: tuple[KnobConfig, tuple[str, ...], dict[str, object], int, int]) -> None:
    check_round_trip("trtllm", drawn)


def test_every_categorical_combination_round_trips() -> None:
    """Exhaustive over the categorical knobs (the continuous one at both ends and the default)."""
    count = 0
    for engine in ENGINES:
        adapter = get_adapter(engine)
        specs = adapter.knobs()
        fractions = (1e-6, float(specs["memory_fraction"].default), 1.0)
        for fraction in fractions:
            for block in specs["block_size"].choices:
                for caching in specs["prefix_caching"].choices:
                    for policy in specs["schedule_policy"].choices:
                        config = KnobConfig.from_dict(
                            {
                                "memory_fraction": fraction,
                                "block_size": block,
                                "prefix_caching": caching,
                                "schedule_policy": policy,
                            }
                        )
                        rendered = adapter.render("m", config)
                        assert adapter.parse(rendered.argv, rendered.files).config == config
                        count += 1
    assert count == 3 * (4 * 2 * 2 + 5 * 2 * 6 + 5 * 2 * 2)
