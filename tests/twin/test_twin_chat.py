"""``/v1/chat/completions`` of ``twin serve``, driven by the official ``openai`` client, per engine:
chat, multi-turn cache hits, streaming (a chunk per engine step), usage, the engines' error shapes."""

from __future__ import annotations

import asyncio
import json
from typing import Any

import aiohttp
import openai
import pytest
from prometheus_client.parser import text_string_to_metric_families

from prefixtune.twin.chat import Message, answer, ids_text, parse_messages, render_chat, text_ids, text_tokens
from prefixtune.twin.openai_api import error_message
from prefixtune.twin.serve import CHAT_ANSWER_TOKENS, ServeOptions, make_server, serving

MODEL = "meta-llama/Llama-3.1-8B-Instruct"
GPU = "H100-80GB"
SPEEDUP = 200.0
ENGINES = ["vllm", "sglang", "trtllm"]
SYSTEM = "You are a careful assistant. " * 60  # ~450 tokens: several blocks of every engine


def client(url: str) -> openai.AsyncOpenAI:
    return openai.AsyncOpenAI(base_url=f"{url}/v1", api_key="unused", max_retries=0, timeout=60)


# --- the template (pure) -------------------------------------------------------------------------


def test_earlier_turns_are_the_same_leading_tokens_every_turn() -> None:
    turns = [
        Message("system", SYSTEM),
        Message("user", "What is a KV cache?"),
        Message("assistant", "A store of attention keys and values."),
        Message("user", "And prefix caching?"),
    ]
    for k in range(1, len(turns)):
        earlier = render_chat(turns[:k], add_generation_prompt=False)
        assert render_chat(turns)[: len(earlier)] == earlier
    # The generation prompt ends a turn's prompt; the answer follows it as the next turn's message.
    prompt = render_chat(turns[:2])
    text, ids = answer(prompt, 7)
    assert len(text.encode()) == 28 and text_tokens(text) == ids
    nxt = render_chat([*turns[:2], Message("assistant", text), Message("user", "more")])
    assert nxt[: len(prompt) + 7] == prompt + ids


@pytest.mark.parametrize(
    ("messages", "fragment"),
    [
        ([], "messages must be a non-empty list"),
        ([{"role": "wizard", "content": "x"}], "messages[0].role must be one of"),
        ([{"role": "user", "content": [{"type": "image_url", "image_url": {}}]}], "only text content parts"),
        ([{"role": "user", "content": 5}], "must be a string"),
    ],
)
def test_bad_messages_are_named(messages: Any, fragment: str) -> None:
    with pytest.raises(ValueError) as err:
        parse_messages(messages)
    assert fragment in str(err.value)


def test_text_parts_join_with_newlines() -> None:
    parts = [{"type": "text", "text": "a"}, {"type": "text", "text": "b"}]
    assert parse_messages([{"role": "user", "content": parts}]) == [Message("user", "a\nb")]


# --- over HTTP with the openai client -----------------------------------------------------------


@pytest.mark.parametrize("engine", ENGINES)
async def test_chat_usage_and_multi_turn_cache_hits(engine: str) -> None:
    async with serving(engine, MODEL, GPU, (), ServeOptions(speedup=SPEEDUP)) as url:
        oa = client(url)
        history: list[Any] = [{"role": "system", "content": SYSTEM}, {"role": "user", "content": "Hi"}]
        first = await oa.chat.completions.create(model=MODEL, messages=history, max_tokens=40)
        assert first.object == "chat.completion" and first.choices[0].finish_reason == "length"
        content = first.choices[0].message.content
        assert first.choices[0].message.role == "assistant" and content and len(content) == 4 * 40
        u1 = first.usage
        assert u1 is not None and u1.completion_tokens == 40
        assert u1.total_tokens == u1.prompt_tokens + 40
        assert u1.prompt_tokens_details is not None and u1.prompt_tokens_details.cached_tokens == 0
        # Turn 2 sends turn 1 back: its prompt and answer are cached (whole blocks of them).
        history += [{"role": "assistant", "content": content}, {"role": "user", "content": "Go on"}]
        second = await oa.chat.completions.create(model=MODEL, messages=history, max_tokens=5)
        u2 = second.usage
        assert u2 is not None and u2.prompt_tokens_details is not None
        cached = u2.prompt_tokens_details.cached_tokens
        assert cached is not None
        shared = u1.prompt_tokens + 40  # turn 1's prompt + answer: the leading tokens of turn 2
        assert shared - 64 <= cached <= shared  # whole blocks (at most 64 tokens) of it
        # No max_tokens: the twin's model ends its turn.
        third = await oa.chat.completions.create(model=MODEL, messages=[{"role": "user", "content": "x"}])
        assert third.choices[0].finish_reason == "stop"
        assert third.usage is not None and third.usage.completion_tokens == CHAT_ANSWER_TOKENS
        await oa.close()


@pytest.mark.parametrize("engine", ENGINES)
async def test_streaming_chat_with_usage(engine: str) -> None:
    messages: list[Any] = [{"role": "system", "content": SYSTEM}, {"role": "user", "content": "Stream"}]
    async with serving(engine, MODEL, GPU, (), ServeOptions(speedup=SPEEDUP)) as url:
        oa = client(url)
        whole = await oa.chat.completions.create(model=MODEL, messages=messages, max_completion_tokens=30)
        stream = await oa.chat.completions.create(
            model=MODEL,
            messages=messages,
            max_completion_tokens=30,
            stream=True,
            stream_options={"include_usage": True},
        )
        chunks = [c async for c in stream]
        await oa.close()
    assert all(c.object == "chat.completion.chunk" for c in chunks)
    assert chunks[0].choices[0].delta.role == "assistant" and chunks[0].choices[0].delta.content == ""
    body = [c for c in chunks if c.choices]
    assert "".join(c.choices[0].delta.content or "" for c in body) == whole.choices[0].message.content
    assert [c.choices[0].finish_reason for c in body][-1] == "length"
    assert all(c.choices[0].finish_reason is None for c in body[:-1])
    last = chunks[-1]
    assert last.choices == [] and last.usage is not None
    assert last.usage.completion_tokens == 30 and last.usage.prompt_tokens == whole.usage.prompt_tokens  # type: ignore[union-attr]
    # Same prompt again: the second request hit the first one's blocks, and usage says so.
    assert last.usage.prompt_tokens_details is not None and last.usage.prompt_tokens_details.cached_tokens


async def test_stream_sends_a_chunk_per_engine_step() -> None:
    """With the clock driven by hand in steps shorter than an engine step, every chunk after the role
    carries exactly one token, and none arrives before the simulated time the engine produced it at
    (an advance completes the step under way, so the engine runs up to a step ahead of the clock)."""
    server = make_server("vllm", MODEL, GPU, (), ServeOptions(speedup=1.0))
    url = await server.start()
    assert server._ticker is not None
    server._ticker.cancel()
    clock = [0.0]
    server.sim_now = lambda: clock[0]  # type: ignore[method-assign]
    times: list[tuple[float, int]] = []
    n = 12
    arrival = done_at = -1.0
    messages = [{"role": "system", "content": SYSTEM}, {"role": "user", "content": "hello"}]
    try:
        async with aiohttp.ClientSession() as http:
            body = {"messages": messages, "max_tokens": n, "stream": True}
            async with http.post(f"{url}/v1/chat/completions", json=body) as resp:
                assert resp.status == 200
                while True:
                    clock[0] += 0.0005  # 0.5 ms of simulated time: shorter than any decode step
                    server.catch_up()
                    if arrival < 0 and server.pending:
                        arrival = next(iter(server.pending.values())).req.arrival_s
                    try:
                        line = await asyncio.wait_for(resp.content.readline(), 0.01)
                    except TimeoutError:
                        continue
                    if not line.startswith(b"data: "):
                        continue
                    data = line[len(b"data: ") :].strip()
                    if data == b"[DONE]":
                        done_at = clock[0]
                        break
                    delta = json.loads(data)["choices"][0]["delta"]
                    if delta.get("content"):
                        times.append((clock[0], len(delta["content"]) // 4))
    finally:
        await server.stop()
    assert sum(k for _, k in times) == n
    assert [k for _, k in times] == [1] * n  # one token per chunk: one per engine step
    assert len(server.first_chunk_s) == 1  # the server's side of the client's TTFT, recorded
    sums = {
        name: value
        for family in text_string_to_metric_families(server.exporter.render().decode())
        for name, _, value in [(s.name, s.labels, s.value) for s in family.samples]
        if name in {"vllm:time_to_first_token_seconds_sum", "vllm:e2e_request_latency_seconds_sum"}
    }
    ttft, e2e = sums["vllm:time_to_first_token_seconds_sum"], sums["vllm:e2e_request_latency_seconds_sum"]
    assert ttft > 0.001 and e2e > ttft
    assert times[0][0] >= arrival + ttft  # the first token is not sent before the engine made it
    assert done_at >= arrival + e2e  # nor the end before the request finished


@pytest.mark.parametrize("engine", ENGINES)
async def test_errors_have_each_engines_shape(engine: str) -> None:
    async with (
        serving(engine, MODEL, GPU, (), ServeOptions(speedup=SPEEDUP)) as url,
        aiohttp.ClientSession() as http,
    ):
        bad = {"model": "other", "messages": [{"role": "user", "content": "x"}]}
        async with http.post(f"{url}/v1/chat/completions", json=bad) as resp:
            status, data = resp.status, await resp.json()
        async with http.post(f"{url}/v1/chat/completions", json={"messages": "x"}) as resp:
            status2, data2 = resp.status, await resp.json()
        oa = client(url)
        with pytest.raises(openai.NotFoundError) as err:
            await oa.chat.completions.create(model="other", messages=[{"role": "user", "content": "x"}])
        with pytest.raises(openai.BadRequestError, match="maximum context length"):
            await oa.chat.completions.create(
                model=MODEL, messages=[{"role": "user", "content": "x"}], max_tokens=10**6
            )
        await oa.close()
    assert status == 404 and status2 == 400
    expected = {"message": "The model `other` does not exist.", "type": "NotFoundError", "param": "model"}
    if engine == "vllm":  # vLLM: OpenAI's {"error": {...}}
        assert data == {"error": {**expected, "code": 404}}
    else:  # SGLang and TensorRT-LLM: the flat {"object": "error", ...}
        assert data == {"object": "error", **expected, "code": 404}
    assert "messages must be a non-empty list" in error_message(data2)
    assert "does not exist" in str(err.value)


def test_ids_text_keeps_exactly_the_shared_prefix_in_characters_and_in_twin_tokens() -> None:
    a, b = [5, 70_000, 128_255, 9, 9], [5, 70_000, 128_255, 10]
    ta, tb = ids_text(a), ids_text(b)
    assert ta.isascii() and len(ta) == 4 * len(a)
    common = next(i for i, (x, y) in enumerate(zip(ta, tb, strict=False)) if x != y)
    assert common // 4 == 3  # the texts part where the ids part
    assert text_ids(a)[:3] == text_ids(b)[:3] and text_ids(a)[3] != text_ids(b)[3]
    assert len(text_ids(a)) == len(a)
    assert text_ids(a) == text_tokens(ta)  # the table and the text agree
