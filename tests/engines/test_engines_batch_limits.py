"""The batch limits as knobs (issue #23): the token budget and the running cap on the three engines."""

from __future__ import annotations

import itertools

import pytest
import yaml

from prefixtune.engines import ArgsError, KnobConfig, get_adapter
from prefixtune.engines.base import GIB, MAX_BATCHED_TOKENS, MAX_RUNNING, REFERENCE, Hardware
from prefixtune.engines.knobs import BY_NAME, ENGINE_DEFAULT, api_text, config_text, to_api
from prefixtune.engines.sglang import default_mem_fraction_static
from prefixtune.engines.trtllm import OPTIONS_PATH
from prefixtune.twin.catalog import GPUS
from prefixtune.twin.models import twin_model

ENGINES = ("vllm", "sglang", "trtllm")
H100 = Hardware("H100-80GB", 79.1 * GIB)
# The flag (or options-file key) each engine reads each batch limit from.
FLAGS = {
    "vllm": ("--max-num-batched-tokens", "--max-num-seqs"),
    "sglang": ("--chunked-prefill-size", "--max-running-requests"),
    "trtllm": ("max_num_tokens", "max_batch_size"),
}


def _limits(engine: str, tokens: int, running: int) -> KnobConfig:
    return get_adapter(engine).default_config().with_(max_batched_tokens=tokens, max_running=running)


def _rendered_limits(engine: str, config: KnobConfig) -> dict[str, int]:
    """The batch limits as the rendered command (or options file) states them."""
    rendered = get_adapter(engine).render("m", config)
    if engine == "trtllm":
        document = yaml.safe_load(rendered.files[OPTIONS_PATH])
        return {key: document[key] for key in FLAGS[engine] if key in document}
    argv = list(rendered.argv)
    return {flag: int(argv[argv.index(flag) + 1]) for flag in FLAGS[engine] if flag in argv}


@pytest.mark.parametrize("engine", ENGINES)
def test_each_engine_renders_the_batch_limits_to_its_own_flags(engine: str) -> None:
    tokens_flag, running_flag = FLAGS[engine]
    assert _rendered_limits(engine, _limits(engine, 4096, 128)) == {tokens_flag: 4096, running_flag: 128}


@pytest.mark.parametrize("engine", ENGINES)
def test_a_batch_limit_at_the_engine_default_is_not_rendered_and_reads_back_as_it(engine: str) -> None:
    adapter = get_adapter(engine)
    config = _limits(engine, ENGINE_DEFAULT, ENGINE_DEFAULT)
    assert _rendered_limits(engine, config) == {}
    rendered = adapter.render("m", config)
    parsed = adapter.parse(rendered.argv, rendered.files)
    assert (parsed.config.max_batched_tokens, parsed.config.max_running) == (0, 0)
    assert MAX_BATCHED_TOKENS not in parsed.options and MAX_RUNNING not in parsed.options


@pytest.mark.parametrize("engine", ENGINES)
def test_every_searched_pair_of_batch_limits_round_trips(engine: str) -> None:
    adapter = get_adapter(engine)
    knobs = adapter.knobs()
    checked = 0
    for tokens, running in itertools.product(
        (0, *knobs[MAX_BATCHED_TOKENS].choices), (0, *knobs[MAX_RUNNING].choices)
    ):
        config = _limits(engine, int(tokens), int(running))
        if adapter.validate(config):
            continue  # vLLM: a budget below the running cap (refused: see below)
        rendered = adapter.render("m", config)
        assert adapter.parse(rendered.argv, rendered.files).config == config
        checked += 1
    assert checked >= 50


def test_an_adopted_command_with_a_limit_off_the_ladder_parses() -> None:
    parsed = get_adapter("vllm").parse(["vllm", "serve", "m", "--max-num-seqs", "48"])
    assert parsed.config.max_running == 48
    assert parsed.options[MAX_RUNNING] == 48  # what the twin reads


@pytest.mark.parametrize(
    ("engine", "argv", "message"),
    [
        ("vllm", ["--max-num-seqs", "0"], "must be >= 1"),
        ("vllm", ["--max-num-batched-tokens", str(2**21)], "max_batched_tokens must be in [1, 1048576]"),
        ("sglang", ["--chunked-prefill-size", "-2"], "must be -1 (disables chunked prefill) or >= 1"),
        ("sglang", ["--max-running-requests", "100000"], "max_running must be in [1, 65536]"),
    ],
)
def test_a_batch_limit_out_of_the_engines_range_is_refused(
    engine: str, argv: list[str], message: str
) -> None:
    adapter = get_adapter(engine)
    head = list(adapter.render("m", adapter.default_config()).argv)
    with pytest.raises(ArgsError, match=message.replace("[", r"\[").replace("(", r"\(").replace(")", r"\)")):
        adapter.parse([*head, *argv])


def test_sglang_takes_minus_one_as_chunking_off() -> None:
    adapter = get_adapter("sglang")
    config = _limits("sglang", -1, 0)
    rendered = adapter.render("m", config)
    parsed = adapter.parse(rendered.argv)
    assert parsed.config.max_batched_tokens == -1
    assert parsed.options["chunked_prefill"] is False


def test_vllm_refuses_a_token_budget_below_the_running_cap() -> None:
    adapter = get_adapter("vllm")
    assert adapter.validate(_limits("vllm", 512, 1024)) == [
        (
            MAX_BATCHED_TOKENS,
            "vllm: max_batched_tokens (512) must be >= max_running (1024): vLLM refuses "
            "max_num_batched_tokens below max_num_seqs at start",
        )
    ]
    with pytest.raises(ArgsError, match="must be >= max_running"):
        adapter.render("m", _limits("vllm", 512, 1024))
    assert adapter.validate(_limits("vllm", 1024, 1024)) == []
    assert adapter.validate(_limits("vllm", 512, 0)) == []  # the default cap is checked once filled in


def test_vllm_with_chunked_prefill_off_allows_only_budgets_from_max_model_len() -> None:
    adapter = get_adapter("vllm")
    unchunked = ["--no-enable-chunked-prefill", "--max-model-len", "10000"]
    assert adapter.allowed_choices(unchunked) == {MAX_BATCHED_TOKENS: (10000, 16384, 32768, 65536)}
    assert adapter.allowed_choices(["--no-enable-chunked-prefill"]) == {MAX_BATCHED_TOKENS: ()}
    assert adapter.allowed_choices(["--max-model-len", "10000"]) == {}  # chunked prefill on: no rule


@pytest.mark.parametrize(
    ("hardware", "tokens", "running"),
    [
        (Hardware("H100-80GB", 79.1 * GIB), 8192, 1024),
        (Hardware("H200", 139.8 * GIB), 8192, 1024),
        (Hardware("A100-80GB", 79.15 * GIB), 2048, 256),  # vLLM keeps A100s on the small tier
        (Hardware("B200", 178 * GIB), 16384, 1024),
        (Hardware("L4", 22 * GIB), 2048, 256),
    ],
)
def test_vllm_defaults_follow_its_device_table(hardware: Hardware, tokens: int, running: int) -> None:
    config = get_adapter("vllm").default_config_for(hardware)
    assert (config.max_batched_tokens, config.max_running) == (tokens, running)


@pytest.mark.parametrize(
    ("gib", "chunk"), [(15.0, 2048), (22.0, 4096), (44.0, 4096), (79.1, 8192), (139.8, 8192), (178.0, 16384)]
)
def test_sglang_chunk_default_follows_its_gpu_memory_tiers(gib: float, chunk: int) -> None:
    config = get_adapter("sglang").default_config_for(Hardware("gpu", gib * GIB))
    assert config.max_batched_tokens == chunk
    assert config.max_running == ENGINE_DEFAULT  # derived from the KV pool at start


def test_sglang_default_memory_fraction_follows_a_pinned_chunk() -> None:
    adapter = get_adapter("sglang")
    default = adapter.default_config_for(H100)
    larger = adapter.default_config_for(H100, {MAX_BATCHED_TOKENS: 16384})
    assert larger.max_batched_tokens == 16384
    assert larger.memory_fraction == default_mem_fraction_static(H100.memory_bytes, 1, 16384)
    assert larger.memory_fraction < default.memory_fraction  # 1.5 MiB per chunk token outside the pool


def test_trtllm_defaults_are_trtllm_serves_on_every_gpu() -> None:
    for hardware in (H100, Hardware("L4", 22 * GIB)):
        config = get_adapter("trtllm").default_config_for(hardware)
        assert (config.max_batched_tokens, config.max_running) == (8192, 2048)


def test_pinned_values_win_over_the_hardware_defaults() -> None:
    config = get_adapter("vllm").default_config_for(H100, {MAX_RUNNING: 64, "block_size": 32})
    assert (config.max_batched_tokens, config.max_running, config.block_size) == (8192, 64, 32)


def test_a_small_pinned_vllm_budget_lowers_the_default_running_cap_as_vllm_does() -> None:
    # vllm/engine/arg_utils.py 0.33.0: an unset max_num_seqs becomes min(its default, the budget)
    adapter = get_adapter("vllm")
    config = adapter.default_config_for(H100, {MAX_BATCHED_TOKENS: 512})
    assert (config.max_batched_tokens, config.max_running) == (512, 512)
    assert adapter.cross_check(config) == [] and adapter.validate(config) == []
    pinned_both = adapter.default_config_for(H100, {MAX_BATCHED_TOKENS: 512, MAX_RUNNING: 1024})
    assert adapter.cross_check(pinned_both)  # a cap the user pinned above the budget is still refused


def test_the_reference_hardware_is_the_twins_h100() -> None:
    (h100,) = (gpu for gpu in GPUS if gpu.name == REFERENCE.gpu_name)
    assert h100.memory_bytes == REFERENCE.memory_bytes


@pytest.mark.parametrize(("engine", "gpu"), list(itertools.product(ENGINES, GPUS)))
def test_the_twins_scheduler_defaults_are_the_adapters(engine: str, gpu: object) -> None:
    from prefixtune.twin.catalog import GpuHardware

    assert isinstance(gpu, GpuHardware)
    defaults = twin_model(engine).scheduler_defaults(gpu)
    config = get_adapter(engine).default_config_for(Hardware(gpu.name, gpu.memory_bytes))
    assert (defaults.max_batched_tokens, defaults.max_running) == (
        config.max_batched_tokens,
        config.max_running,
    )


@pytest.mark.parametrize("engine", ENGINES)
def test_the_batch_limits_are_not_searched_by_default(engine: str) -> None:
    knobs = get_adapter(engine).knobs()
    for name in (MAX_BATCHED_TOKENS, MAX_RUNNING):
        assert knobs[name].searched is False
        assert knobs[name].default == ENGINE_DEFAULT
        assert knobs[name].open_range
    assert BY_NAME[MAX_BATCHED_TOKENS].log_scale and not BY_NAME[MAX_RUNNING].log_scale
    ladder = [int(c) for c in knobs[MAX_BATCHED_TOKENS].choices if int(c) > 0]
    assert all(b == 2 * a for a, b in itertools.pairwise(ladder))  # powers of two: log-spaced


def test_a_config_stored_before_the_batch_limits_reads_as_the_engine_default() -> None:
    old = {"memory_fraction": 0.9, "block_size": 16, "prefix_caching": True, "schedule_policy": "fcfs"}
    config = KnobConfig.from_dict(old)
    assert (config.max_batched_tokens, config.max_running) == (ENGINE_DEFAULT, ENGINE_DEFAULT)
    with pytest.raises(KeyError):
        KnobConfig.from_dict({"block_size": 16})  # a knob without an unset value is required


def test_texts_name_a_set_limit_and_leave_out_one_at_the_engine_default() -> None:
    config = KnobConfig(0.9, 16, True, "fcfs", 4096, 0)
    assert config_text(config) == "memory 0.9, block 16, caching on, policy fcfs, token budget 4096"
    assert api_text(to_api(config)) == "mem 0.90 · block 16 · cache on · fcfs · tokens 4096"
    assert BY_NAME[MAX_RUNNING].text(0) == "running cap auto"
