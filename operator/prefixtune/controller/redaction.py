"""Log redaction: no credential reaches a log line or a kopf-posted Event.

Installed as a log-record factory, so every record is cleaned when it is created, before any handler
(kopf's Event poster and tracebacks included).
"""

from __future__ import annotations

import logging
import re
from typing import Any

_REDACTIONS: tuple[tuple[re.Pattern[str], str], ...] = (
    # Authorization headers in any quoting: "Authorization: Bearer x", {'Authorization': 'Basic x'}
    (re.compile(r"(?i)(authorization['\"]?\s*[:=]\s*['\"]?(?:(?:bearer|basic)\s+)?)[^\s'\",}]+"), r"\1***"),
    (re.compile(r"(?i)\b(bearer)\s+[A-Za-z0-9._~+/-]{8,}=*"), r"\1 ***"),
    # kubeconfig and ConnectionInfo fields: token: x, token='x', client-key-data: x, password=x
    (
        re.compile(
            r"(?i)(['\"]?\b(?:token|client-key-data|client-certificate-data|password|api[-_]?key)['\"]?"
            r"\s*[:=]\s*['\"]?)(?!None\b)[^\s'\",})]+"
        ),
        r"\1***",
    ),
)
_SECRETS: set[str] = set()
_MIN_SECRET = 8  # literal secret values shorter than this are left to the patterns


def redact(text: str) -> str:
    """``text`` without credentials: registered secret values and anything shaped like one."""
    for secret in sorted(_SECRETS, key=len, reverse=True):
        text = text.replace(secret, "***")
    for pattern, replacement in _REDACTIONS:
        text = pattern.sub(replacement, text)
    return text


def install_log_redaction(*secrets: str | None) -> None:
    """Redact every log record at creation (before any handler, kopf's Event poster included) and
    register ``secrets`` (e.g. the service-account token) to be replaced wherever they appear."""
    _SECRETS.update(s for s in secrets if s and len(s) >= _MIN_SECRET)
    previous = logging.getLogRecordFactory()
    if getattr(previous, "prefixtune_redacting", False):
        return

    def factory(*args: Any, **kwargs: Any) -> logging.LogRecord:
        record = previous(*args, **kwargs)
        try:
            message = record.getMessage()
        except Exception:  # a malformed call: let the handler report it as usual
            return record
        clean = redact(message)
        if clean != message:
            record.msg, record.args = clean, ()
        if record.exc_info and record.exc_info[0] is not None:
            record.exc_text = redact(logging.Formatter().formatException(record.exc_info))
        return record

    factory.prefixtune_redacting = True  # type: ignore[attr-defined]
    logging.setLogRecordFactory(factory)
