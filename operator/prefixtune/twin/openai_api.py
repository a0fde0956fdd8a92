"""The OpenAI-API bodies the engines answer with: error shapes and chat completion objects.

Error bodies, per engine (the servers' ``ErrorResponse`` models):

- vLLM (``vllm/entrypoints/openai/protocol.py``, ``ErrorResponse(error: ErrorInfo)``, stored
  version ``0052bed``): ``{"error": {"message", "type", "param", "code"}}``, OpenAI's own shape.
- SGLang (``python/sglang/srt/entrypoints/openai/protocol.py`` @ ``004c82e``) and TensorRT-LLM
  (``tensorrt_llm/serve/openai_protocol.py`` @ ``0076e93``): the flat
  ``{"object": "error", "message", "type", "param", "code"}``.

``type`` is the engines' name for the status (``BadRequestError``, ``NotFoundError``,
``InternalServerError``) and ``code`` the HTTP status. An error after a stream started is sent as
an event ``{"error": {...}}`` (the body's inner object) before ``[DONE]``, as all three do.

Chat objects follow vLLM's ``serving_chat.py``: ``chat.completion`` with ``message`` and
``finish_reason``; when streaming, ``chat.completion.chunk`` events: first one with
``delta: {"role": "assistant", "content": ""}`` (sent with the first token, as the engines send it
on their first output), then one per output the engine produced (``delta.content``), the last with
``finish_reason``; with ``stream_options.include_usage`` a final chunk with ``choices: []`` and
``usage`` (with ``continuous_usage_stats`` every chunk carries the usage so far).
"""

from __future__ import annotations

import time
from collections.abc import Mapping
from typing import Any

from prefixtune.twin.models.base import twin_model

ERROR_TYPES = {
    400: "BadRequestError",
    403: "PermissionDeniedError",
    404: "NotFoundError",
    500: "InternalServerError",
}


def error_body(engine: str, message: str, status: int, param: str | None = None) -> dict[str, Any]:
    """The JSON body of an HTTP error as ``engine`` sends it."""
    inner: dict[str, Any] = {
        "message": message,
        "type": ERROR_TYPES.get(status, "Error"),
        "param": param,
        "code": status,
    }
    if twin_model(engine).error_envelope:
        return {"error": inner}
    return {"object": "error", **inner}


def stream_error_event(engine: str, message: str, status: int) -> dict[str, Any]:
    """The event an engine sends when a request fails after its stream started."""
    body = error_body(engine, message, status)
    return body if "error" in body else {"error": body}


def error_message(body: object) -> str:
    """The message of an error body of any engine's shape (for clients: load generators)."""
    if not isinstance(body, Mapping):
        return str(body)
    inner = body.get("error")
    if isinstance(inner, Mapping):
        return str(inner.get("message", ""))
    if isinstance(inner, str):
        return inner
    return str(body.get("message", ""))


def usage(prompt_tokens: int, completion_tokens: int, cached_tokens: int) -> dict[str, Any]:
    return {
        "prompt_tokens": prompt_tokens,
        "completion_tokens": completion_tokens,
        "total_tokens": prompt_tokens + completion_tokens,
        "prompt_tokens_details": {"cached_tokens": cached_tokens},
    }


def chat_completion(
    cid: str, model: str, content: str, finish_reason: str, usage_: dict[str, Any]
) -> dict[str, Any]:
    return {
        "id": cid,
        "object": "chat.completion",
        "created": int(time.time()),
        "model": model,
        "choices": [
            {
                "index": 0,
                "message": {"role": "assistant", "content": content, "tool_calls": []},
                "logprobs": None,
                "finish_reason": finish_reason,
                "stop_reason": None,
            }
        ],
        "usage": usage_,
    }


def chat_chunk(
    cid: str,
    model: str,
    delta: dict[str, Any],
    finish_reason: str | None = None,
    usage_: dict[str, Any] | None = None,
) -> dict[str, Any]:
    chunk: dict[str, Any] = {
        "id": cid,
        "object": "chat.completion.chunk",
        "created": int(time.time()),
        "model": model,
        "choices": [{"index": 0, "delta": delta, "logprobs": None, "finish_reason": finish_reason}],
    }
    if usage_ is not None:
        chunk["usage"] = usage_
    return chunk


def usage_chunk(cid: str, model: str, usage_: dict[str, Any]) -> dict[str, Any]:
    return {
        "id": cid,
        "object": "chat.completion.chunk",
        "created": int(time.time()),
        "model": model,
        "choices": [],
        "usage": usage_,
    }
