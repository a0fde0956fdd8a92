"""The emulator's errors: canonical Kubernetes ``Status`` objects (reason, message, code, details)."""

from __future__ import annotations

import logging
from typing import Any

import aiohttp.web
import kmock

logger = logging.getLogger(__name__)

_REASONS = {
    400: "BadRequest",
    401: "Unauthorized",
    403: "Forbidden",
    404: "NotFound",
    405: "MethodNotAllowed",
    409: "Conflict",
    410: "Expired",
    415: "UnsupportedMediaType",
    422: "Invalid",
    500: "InternalError",
}


class ApiError(kmock.KubernetesError):
    """An error rendered exactly as given: a canonical Kubernetes Status."""


def api_error(code: int, message: str, reason: str | None = None, **details: Any) -> ApiError:
    return ApiError(
        status=code, reason=reason or _REASONS.get(code, "Unknown"), message=message, details=details
    )


def kind_ref(res: kmock.resource) -> str:
    return f"{res.plural}.{res.group}" if res.group else str(res.plural)


def details(res: kmock.resource, name: Any) -> dict[str, Any]:
    return {"name": name, "group": res.group, "kind": res.plural}


def not_found(res: kmock.resource, name: Any) -> ApiError:
    return api_error(404, f'{kind_ref(res)} "{name}" not found', **details(res, name))


def render_error(exc: Exception) -> aiohttp.web.StreamResponse:
    if isinstance(exc, ApiError):
        code, reason, message, details = exc.status, exc.reason, exc.message, exc.details or {}
    elif isinstance(exc, kmock.KubernetesError):  # stock kmock errors, made canonical
        code = exc.status
        reason = "AlreadyExists" if code == 409 else _REASONS.get(code, "InternalError")
        message, details = exc.message or reason, {}
    elif isinstance(exc, NotImplementedError):  # no reaction matched
        code, reason, message, details = (
            404,
            "NotFound",
            "the server could not find the requested resource",
            {},
        )
    else:
        logger.exception("emulator: internal error")
        code, reason, message, details = 500, "InternalError", f"internal error: {exc!r}", {}
    body = {
        "apiVersion": "v1",
        "kind": "Status",
        "metadata": {},
        "status": "Failure",
        "message": message,
        "reason": reason,
        "details": details,
        "code": code,
    }
    return aiohttp.web.json_response(body, status=code)
