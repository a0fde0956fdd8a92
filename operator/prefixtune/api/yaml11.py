"""YAML 1.1 booleans: the unquoted words that kubectl and PyYAML read as true or false.

kubectl converts YAML to JSON with go-yaml v2 (``sigs.k8s.io/yaml``), whose resolver
(``gopkg.in/yaml.v2/resolve.go``) reads y, yes, true, on (and their Title and UPPER spellings) as
true and n, no, false, off as false; PyYAML does the same except for y and n. So an enum value that
is one of these words (``tuning.mode: off``) arrives as a boolean unless it is quoted, and the
message must say to quote it rather than list the value the user believes they wrote.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping

_TRUE = ("y", "yes", "true", "on")
_FALSE = ("n", "no", "false", "off")

BOOLEAN_WORDS: Mapping[str, bool] = {
    spelling: value
    for words, value in ((_TRUE, True), (_FALSE, False))
    for word in words
    for spelling in (word, word.title(), word.upper())
}


def read_as(word: str) -> bool | None:
    """The boolean an unquoted ``word`` becomes in YAML 1.1; None: it stays a string."""
    return BOOLEAN_WORDS.get(word)


def meant(value: bool, allowed: Iterable[object]) -> list[str]:
    """The allowed string values that YAML 1.1 turns into ``value`` when unquoted: what the user
    most likely wrote (``off`` for false where ``off`` is allowed)."""
    return [v for v in allowed if isinstance(v, str) and read_as(v) is value]


def quote_hint(field: str, value: bool, allowed: Iterable[object]) -> str | None:
    """The advice for a boolean given where one of ``allowed`` was meant; None: none was."""
    words = meant(value, allowed)
    if not words:
        return None
    spelled = " or ".join(f'{field}: "{w}"' for w in words)
    written = " or ".join(words)
    return f"an unquoted {written} is the boolean {str(value).lower()} in YAML: write it quoted, {spelled}"


STRING_HINT = "an unquoted yes/no, on/off, y/n or true/false is a boolean in YAML: quote the value"
