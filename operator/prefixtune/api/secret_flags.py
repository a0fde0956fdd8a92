"""Secret-bearing engine flags (``--api-key``, ``--hf-token``, ...): one definition for the redaction
of messages (``validation.secret_values``) and for the rule that refuses them in ``extraArgs``: a
value there sits in the spec, the pod's args and kopf's last-handled-configuration annotation, in
plain text for anyone who can read the resource. Engine secrets come from a Secret reference
(``spec.apiKeySecret``) instead."""

from __future__ import annotations

import re
from collections.abc import Sequence

SECRET_WORDS = frozenset({"key", "token", "secret", "password", "passwd", "credential", "credentials"})


def is_secret_flag(token: str) -> bool:
    """``--api-key``, ``--hf_token=...``: a flag whose name ends in a secret word (not
    ``--long-prefill-token-threshold``, whose value is a count)."""
    if not token.startswith("-"):
        return False
    words = [w for w in re.split(r"[-_.]+", token.partition("=")[0].lower()) if w]
    return bool(words) and words[-1] in SECRET_WORDS


def is_secret_env_name(name: str) -> bool:
    """``HF_TOKEN``, ``AWS_SECRET_ACCESS_KEY``, ``DB_PASSWORD``: an environment variable whose name
    ends in a secret word (not ``TOKENIZERS_PARALLELISM`` or ``HF_TOKEN_PATH``)."""
    words = [w for w in re.split(r"[-_.]+", name.lower()) if w]
    return bool(words) and words[-1] in SECRET_WORDS


def secret_flag_problems(args: Sequence[str]) -> list[tuple[str, str]]:
    """(path, message) for every secret-bearing flag in ``extraArgs`` (the value is never quoted)."""
    problems: list[tuple[str, str]] = []
    for i, arg in enumerate(args):
        if is_secret_flag(arg):
            flag = arg.partition("=")[0]
            problems.append(
                (
                    f"extraArgs[{i}]",
                    f"{flag} would put a secret in plain text in the spec, the pod's args and the "
                    "resource's annotations; give it as spec.apiKeySecret (a Secret reference) instead",
                )
            )
    return problems
