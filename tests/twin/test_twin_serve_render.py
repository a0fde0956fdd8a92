"""vLLM's render routes on ``twin serve`` (``--enable-scale-out``): the token ids vllm-router routes on,
exactly those the twin's completions run; 403 without the flag, 404 on the other engines."""

from __future__ import annotations

from typing import Any

import aiohttp
import pytest

from prefixtune.engines import get_adapter
from prefixtune.twin import serve
from prefixtune.twin.chat import parse_messages, render_chat, text_tokens
from prefixtune.twin.serve import SCALE_OUT_DISABLED, ServeOptions, serving

MODEL = "meta-llama/Llama-3.1-8B-Instruct"
GPU = "H100-80GB"
SPEEDUP = 200.0
SCALE_OUT = ("--enable-scale-out",)
SYSTEM = "You are a careful assistant. " * 40  # 1,160 bytes: 290 twin tokens, 18 full blocks of 16
MESSAGES = [{"role": "system", "content": SYSTEM}, {"role": "user", "content": "What is a KV cache?"}]


async def post(http: aiohttp.ClientSession, url: str, path: str, body: dict[str, Any]) -> tuple[int, Any]:
    async with http.post(f"{url}{path}", json=body) as resp:
        if resp.content_type != "application/json":  # aiohttp's own 404 and 413 are plain text
            return resp.status, await resp.text()
        return resp.status, await resp.json()


async def test_completions_render_answers_one_object_per_prompt_with_the_completions_tokens() -> None:
    prompts = [SYSTEM + "first", SYSTEM + "second"]
    async with (
        serving("vllm", MODEL, GPU, SCALE_OUT, ServeOptions(speedup=SPEEDUP)) as url,
        aiohttp.ClientSession() as http,
    ):
        status, one = await post(http, url, "/v1/completions/render", {"model": MODEL, "prompt": prompts[0]})
        assert status == 200
        status, two = await post(http, url, "/v1/completions/render", {"model": MODEL, "prompt": prompts})
        assert status == 200
    assert isinstance(one, list) and len(one) == 1 and set(one[0]) == {"request_id", "token_ids"}
    assert one[0]["token_ids"] == text_tokens(prompts[0])
    assert [r["token_ids"] for r in two] == [text_tokens(p) for p in prompts]
    assert len({r["request_id"] for r in [*one, *two]}) == 3


async def test_rendered_ids_sent_as_a_prompt_hit_everything_their_text_cached() -> None:
    # The ids are the completions route's own: the text request cached them, the ids request hits
    # every full block of them (vLLM hits at most prompt - 1 tokens, in full blocks of 16).
    prompt = SYSTEM + "tell me more"
    async with (
        serving("vllm", MODEL, GPU, SCALE_OUT, ServeOptions(speedup=SPEEDUP)) as url,
        aiohttp.ClientSession() as http,
    ):
        status, rendered = await post(http, url, "/v1/completions/render", {"prompt": prompt})
        assert status == 200
        ids = rendered[0]["token_ids"]
        status, _ = await post(http, url, "/v1/completions", {"prompt": prompt, "max_tokens": 1})
        assert status == 200
        status, again = await post(http, url, "/v1/completions", {"prompt": ids, "max_tokens": 1})
        assert status == 200
    assert again["usage"]["prompt_tokens"] == len(ids)
    assert again["usage"]["prompt_tokens_details"]["cached_tokens"] == (len(ids) - 1) // 16 * 16


async def test_chat_render_answers_one_object_with_the_chat_prompts_tokens() -> None:
    async with (
        serving("vllm", MODEL, GPU, SCALE_OUT, ServeOptions(speedup=SPEEDUP)) as url,
        aiohttp.ClientSession() as http,
    ):
        body = {"model": MODEL, "messages": MESSAGES, "max_tokens": 2}
        status, rendered = await post(http, url, "/v1/chat/completions/render", body)
        assert status == 200
        status, chat = await post(http, url, "/v1/chat/completions", body)
        assert status == 200
    assert isinstance(rendered, dict) and set(rendered) == {"request_id", "token_ids"}
    assert rendered["request_id"].startswith("chatcmpl-")
    assert rendered["token_ids"] == render_chat(parse_messages(MESSAGES))
    assert chat["usage"]["prompt_tokens"] == len(rendered["token_ids"])


@pytest.mark.parametrize("path", ["/v1/completions/render", "/v1/chat/completions/render"])
async def test_without_the_flag_vllm_refuses_the_render_routes_as_vllm_does(path: str) -> None:
    adapter = get_adapter("vllm")
    unrouted = adapter.render(MODEL, adapter.default_config().with_(routing_policy="kube-proxy")).argv
    assert "--enable-scale-out" not in unrouted
    async with (
        serving("vllm", MODEL, GPU, unrouted, ServeOptions(speedup=SPEEDUP)) as url,
        aiohttp.ClientSession() as http,
    ):
        status, body = await post(http, url, path, {"prompt": "x", "messages": MESSAGES})
    assert status == 403
    assert body == {
        "error": {"message": SCALE_OUT_DISABLED, "type": "PermissionDeniedError", "param": None, "code": 403}
    }


@pytest.mark.parametrize("engine", ["sglang", "trtllm"])
async def test_the_other_engines_have_no_render_route(engine: str) -> None:
    async with (
        serving(engine, MODEL, GPU, (), ServeOptions(speedup=SPEEDUP)) as url,
        aiohttp.ClientSession() as http,
    ):
        status, _ = await post(http, url, "/v1/completions/render", {"prompt": "x"})
    assert status == 404


async def test_a_render_request_is_checked_as_its_completion_would_be() -> None:
    async with (
        serving("vllm", MODEL, GPU, SCALE_OUT, ServeOptions(speedup=SPEEDUP)) as url,
        aiohttp.ClientSession() as http,
    ):
        too_long = {"prompt": [1] * 131_000, "max_tokens": 1000}
        status, body = await post(http, url, "/v1/completions/render", too_long)
        assert status == 400 and "maximum context length is 131072" in body["error"]["message"]
        status, body = await post(http, url, "/v1/completions/render", {"model": "other", "prompt": "x"})
        assert status == 404 and "does not exist" in body["error"]["message"]
        status, body = await post(http, url, "/v1/chat/completions/render", {"messages": []})
        assert status == 400 and "messages must be a non-empty list" in body["error"]["message"]


@pytest.mark.parametrize("path", ["/v1/completions", "/v1/completions/render", "/v1/chat/completions/render"])
async def test_a_render_body_over_the_servers_limit_is_refused_as_on_the_other_routes(
    path: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setattr(serve, "MAX_BODY_BYTES", 4096)
    async with (
        serving("vllm", MODEL, GPU, SCALE_OUT, ServeOptions(speedup=SPEEDUP)) as url,
        aiohttp.ClientSession() as http,
    ):
        status, _ = await post(http, url, path, {"prompt": "x" * 8192, "messages": MESSAGES})
    assert status == 413
