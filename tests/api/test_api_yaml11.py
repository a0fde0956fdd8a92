"""YAML 1.1 booleans (issue #18, item 9): ``tuning: {mode: off}`` arrives as ``mode: false``; the
message says to quote it, and an enum value of any field that YAML reads as a boolean gets the same."""

from __future__ import annotations

import re
from collections.abc import Iterator, Mapping
from pathlib import Path
from typing import Any

import pytest
import yaml

from prefixtune.api.enums import TuningMode
from prefixtune.api.models import ServingDeploymentSpec
from prefixtune.api.schema import structural_schema
from prefixtune.api.validation import validate_spec
from prefixtune.api.yaml11 import BOOLEAN_WORDS, STRING_HINT, read_as


def _errors(text: str) -> list[str]:
    spec, errors = validate_spec(yaml.safe_load(text))
    assert spec is None
    return [str(e) for e in errors]


def test_mode_off_unquoted_is_refused_with_the_advice_to_quote_it() -> None:
    (error,) = _errors("{engine: vllm, model: m/x, tuning: {mode: off}}")
    assert error.startswith("spec.tuning.mode: false is not allowed; allowed: off, observe, auto")
    assert 'write it quoted, mode: "off"' in error


@pytest.mark.parametrize("spelling", ["off", "Off", "OFF", "no", "false", "n"])
def test_every_spelling_yaml_reads_as_false_gets_the_same_advice(spelling: str) -> None:
    raw = {"engine": "vllm", "model": "m/x", "tuning": {"mode": read_as(spelling)}}
    _, errors = validate_spec(raw)
    assert [e.path for e in errors] == ["spec.tuning.mode"]
    assert 'mode: "off"' in errors[0].message


def test_mode_off_quoted_is_accepted() -> None:
    spec, errors = validate_spec(yaml.safe_load('{engine: vllm, model: m/x, tuning: {mode: "off"}}'))
    assert errors == [] and spec is not None
    assert spec.tuning.mode is TuningMode.OFF


def test_a_true_for_mode_names_no_value_no_allowed_value_reads_as_true() -> None:
    (error,) = _errors("{engine: vllm, model: m/x, tuning: {mode: on}}")
    assert error == "spec.tuning.mode: true is not allowed; allowed: off, observe, auto"


def test_a_boolean_where_a_string_is_expected_says_to_quote_the_value() -> None:
    (error,) = _errors("{engine: vllm, model: m/x, extraArgs: [--enforce-eager, yes]}")
    assert error.startswith("spec.extraArgs[1]: expected a string") and error.endswith(STRING_HINT)


def test_the_spellings_are_the_ones_pyyaml_reads_as_booleans() -> None:
    # kubectl's go-yaml v2 also reads y/Y/n/N as booleans; PyYAML keeps them strings.
    for word, value in BOOLEAN_WORDS.items():
        loaded = yaml.safe_load(f"v: {word}")["v"]
        assert loaded is value or (word.lower() in {"y", "n"} and loaded == word), word
    assert yaml.safe_load("v: observe")["v"] == "observe" and read_as("observe") is None


def _enums(
    node: Mapping[str, Any], path: tuple[str, ...] = ()
) -> Iterator[tuple[tuple[str, ...], list[Any]]]:
    if "enum" in node:
        yield path, list(node["enum"])
    for name, child in (node.get("properties") or {}).items():
        yield from _enums(child, (*path, name))


def _nested(path: tuple[str, ...], value: object) -> dict[str, Any]:
    out: dict[str, Any] = {path[-1]: value}
    for name in reversed(path[:-1]):
        out = {name: out}
    return out


def test_every_enum_value_yaml_reads_as_a_boolean_gets_the_advice_to_quote_it() -> None:
    schema = structural_schema(ServingDeploymentSpec)
    words = [
        (path, v)
        for path, values in _enums(schema)
        for v in values
        if isinstance(v, str) and read_as(v) is not None
    ]
    assert (("tuning", "mode"), "off") in words  # the one the README writes
    for path, word in words:
        raw = {"engine": "vllm", "model": "m/x", **_nested(path, read_as(word))}
        _, errors = validate_spec(raw)
        messages = [e.message for e in errors if e.path == "spec." + ".".join(path)]
        assert messages and f'{path[-1]}: "{word}"' in messages[0], (path, word, errors)


ROOT = Path(__file__).resolve().parents[2]
USER_FACING = ("README.md", "docs", "examples", "charts", "bench")


def _user_facing_files() -> Iterator[Path]:
    for name in USER_FACING:
        path = ROOT / name
        candidates = [path] if path.is_file() else sorted(path.rglob("*"))
        yield from (p for p in candidates if p.suffix in {".md", ".yaml", ".yml", ".py", ".txt", ".tpl"})


def test_no_user_facing_file_writes_such_an_enum_value_unquoted() -> None:
    schema = structural_schema(ServingDeploymentSpec)
    words = {
        (path[-1], v)
        for path, values in _enums(schema)
        for v in values
        if isinstance(v, str) and read_as(v) is not None
    }
    assert ("mode", "off") in words
    patterns = [re.compile(rf"\b{field}:\s*{word}\b") for field, word in sorted(words)]
    files = list(_user_facing_files())
    assert any(p.name == "README.md" for p in files) and any(p.parent.name == "examples" for p in files)
    found = [
        f"{p.relative_to(ROOT)}:{n}: {line.strip()}"
        for p in files
        for n, line in enumerate(p.read_text(errors="replace").splitlines(), start=1)
        if any(pattern.search(line) for pattern in patterns)
    ]
    assert found == []


def test_the_scan_sees_an_unquoted_value() -> None:
    pattern = re.compile(r"\bmode:\s*off\b")
    assert pattern.search("  tuning: {mode: off}") and not pattern.search('  tuning: {mode: "off"}')
