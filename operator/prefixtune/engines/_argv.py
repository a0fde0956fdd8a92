"""A small, strict command-line scanner shared by the engine adapters.

The engines use argparse (vLLM, SGLang) or click (TensorRT-LLM). We cannot import them, so each
adapter declares the flags it knows as :class:`Flag` tables and this module scans an argv the way
those parsers do: ``--flag value`` and ``--flag=value``, store-true switches, ``--x/--no-x`` pairs,
``nargs="+"`` lists, negative numbers as values. Anything not declared is reported the way argparse
reports it ("unrecognized arguments: ..."), so an unknown flag never passes silently.

Every scanned item keeps its raw tokens, so an adapter can hand the untuned flags back verbatim and
``render(parse(argv)) == argv`` holds.
"""

from __future__ import annotations

import re
from collections.abc import Callable, Iterable, Mapping, Sequence
from dataclasses import dataclass
from enum import Enum

from prefixtune.engines.base import ArgsError


class Kind(Enum):
    VALUE = "value"  # takes exactly one value: --x v | --x=v
    SWITCH = "switch"  # store_true / click is_flag: --x
    NEGATABLE = "negatable"  # argparse BooleanOptionalAction: --x / --no-x
    LIST = "list"  # nargs="+": --x a b c


class Role(Enum):
    OWNED = "owned"  # rendered by the operator (tuned knobs, model, port, host, tp); extraArgs may not set it
    FORBIDDEN = "forbidden"  # a real engine flag that would override a tuned knob; refused everywhere
    OPTION = "option"  # a recognised, untuned flag; passed through verbatim
    REMOVED = "removed"  # a flag older releases had and this one refuses at start (``why`` says instead)


Converter = Callable[[str], object]


@dataclass(frozen=True)
class Flag:
    """One flag an engine accepts.

    ``names`` are every spelling (the first is canonical); ``negations`` the ``--no-x`` spellings of a
    NEGATABLE flag. ``convert`` turns the raw text into a value and raises ValueError with a message
    that names the allowed values. ``why`` explains a FORBIDDEN flag.
    """

    dest: str
    names: tuple[str, ...]
    kind: Kind = Kind.VALUE
    role: Role = Role.OPTION
    convert: Converter = str
    negations: tuple[str, ...] = ()
    why: str = ""

    @property
    def spellings(self) -> tuple[str, ...]:
        return self.names + self.negations


@dataclass(frozen=True)
class Item:
    """One scanned flag occurrence: its value (True/False for switches) and the raw tokens."""

    flag: Flag
    value: object
    tokens: tuple[str, ...]


@dataclass(frozen=True)
class Scan:
    items: tuple[Item, ...]
    positionals: tuple[str, ...]

    def last(self, dest: str) -> Item | None:
        """The last occurrence wins, as in argparse and click."""
        found = None
        for item in self.items:
            if item.flag.dest == dest:
                found = item
        return found

    def value(self, dest: str, default: object = None) -> object:
        item = self.last(dest)
        return default if item is None else item.value

    def int_value(self, dest: str, default: int) -> int:
        value = self.value(dest, default)
        assert isinstance(value, int), f"{dest} is not an int flag"
        return value

    def str_value(self, dest: str, default: str) -> str:
        return str(self.value(dest, default))


_NEGATIVE_NUMBER = re.compile(r"^-\d+$|^-\d*\.\d+$")


def looks_like_flag(token: str) -> bool:
    return token.startswith("-") and token != "-" and not _NEGATIVE_NUMBER.match(token)


class FlagTable:
    """The flags of one engine, indexed by every spelling.

    ``normalize_name`` rewrites a flag name before lookup (vLLM's FlexibleArgumentParser turns
    underscores into dashes, so ``--block_size`` is ``--block-size``).
    """

    def __init__(self, flags: Iterable[Flag], normalize_name: Callable[[str], str] = lambda s: s) -> None:
        self.flags: tuple[Flag, ...] = tuple(flags)
        self.normalize_name = normalize_name
        self._by_name: dict[str, tuple[Flag, bool]] = {}
        for flag in self.flags:
            for name in flag.names:
                self._add(name, flag, True)
            for name in flag.negations:
                self._add(name, flag, False)

    def _add(self, name: str, flag: Flag, positive: bool) -> None:
        if name in self._by_name:
            raise AssertionError(f"flag {name} declared twice")
        self._by_name[name] = (flag, positive)

    def lookup(self, name: str) -> tuple[Flag, bool] | None:
        return self._by_name.get(self.normalize_name(name))

    def by_dest(self, dest: str) -> Flag:
        for flag in self.flags:
            if flag.dest == dest:
                return flag
        raise KeyError(dest)

    def spellings(self, *roles: Role) -> frozenset[str]:
        return frozenset(name for flag in self.flags if flag.role in roles for name in flag.spellings)

    def flag_of(self, token: str) -> Flag | None:
        """The flag a token names (``--x`` or ``--x=v``); None for values and unknown flags."""
        if not looks_like_flag(token):
            return None
        found = self.lookup(token.split("=", 1)[0])
        return None if found is None else found[0]

    def scan(self, tokens: Sequence[str], max_positionals: int = 0) -> Scan:
        """Scan ``tokens``; unknown flags and positionals beyond ``max_positionals`` are refused
        together, in order, as argparse does ("unrecognized arguments: --foo 3")."""
        items: list[Item] = []
        positionals: list[str] = []
        unknown: list[str] = []
        i = 0
        while i < len(tokens):
            token = tokens[i]
            if token == "--":
                for rest in tokens[i + 1 :]:
                    (positionals if len(positionals) < max_positionals else unknown).append(rest)
                break
            if not looks_like_flag(token):
                (positionals if len(positionals) < max_positionals else unknown).append(token)
                i += 1
                continue
            name, eq, inline = token.partition("=")
            found = self.lookup(name)
            if found is None:
                unknown.append(token)
                i += 1
                continue
            flag, positive = found
            if flag.kind in (Kind.SWITCH, Kind.NEGATABLE):
                if eq:
                    raise ArgsError(f"argument {name}: ignored explicit argument {inline!r}")
                items.append(Item(flag, positive, (token,)))
                i += 1
                continue
            if flag.kind is Kind.VALUE:
                used: tuple[str, ...]
                if eq:
                    raw, used = inline, (token,)
                    i += 1
                else:
                    if i + 1 >= len(tokens) or looks_like_flag(tokens[i + 1]):
                        raise ArgsError(f"argument {name}: expected one argument")
                    raw, used = tokens[i + 1], (token, tokens[i + 1])
                    i += 2
                items.append(Item(flag, _convert(flag, name, raw), used))
                continue
            # LIST: one or more values up to the next flag
            values = [inline] if eq else []
            j = i + 1
            while j < len(tokens) and not looks_like_flag(tokens[j]) and tokens[j] != "--":
                values.append(tokens[j])
                j += 1
            if not values:
                raise ArgsError(f"argument {name}: expected at least one argument")
            items.append(Item(flag, tuple(_convert(flag, name, v) for v in values), tuple(tokens[i:j])))
            i = j
        if unknown:
            raise ArgsError(f"unrecognized arguments: {' '.join(unknown)}")
        return Scan(tuple(items), tuple(positionals))


def _convert(flag: Flag, name: str, raw: str) -> object:
    try:
        return flag.convert(raw)
    except ValueError as exc:
        raise ArgsError(f"argument {name}: invalid value {raw!r}: {exc}") from None


# Converters. Each raises ValueError with a message naming what is allowed.


def to_int(low: int | None = None) -> Converter:
    def convert(raw: str) -> object:
        try:
            value = int(raw)
        except ValueError:
            raise ValueError("expected an integer") from None
        if low is not None and value < low:
            raise ValueError(f"must be >= {low}")
        return value

    return convert


def to_float(low: float | None = None) -> Converter:
    def convert(raw: str) -> object:
        try:
            value = float(raw)
        except ValueError:
            raise ValueError("expected a number") from None
        if value != value or value in (float("inf"), float("-inf")):
            raise ValueError("expected a finite number")
        if low is not None and value < low:
            raise ValueError(f"must be >= {low}")
        return value

    return convert


def to_choice(choices: Sequence[str], mapping: Mapping[str, object] | None = None) -> Converter:
    def convert(raw: str) -> object:
        if raw not in choices:
            raise ValueError(f"choose from {', '.join(choices)}")
        return raw if mapping is None else mapping[raw]

    return convert


def to_text(raw: str) -> object:
    if not raw:
        raise ValueError("expected a non-empty value")
    return raw


def format_float(value: float) -> str:
    """Shortest text that reads back to the same float (``repr``), so render/parse round-trip."""
    return repr(float(value))


def owned_tokens(table: FlagTable, args: Sequence[str]) -> list[str]:
    """Tokens in ``args`` that set an OWNED or FORBIDDEN flag (either ``--x v`` or ``--x=v`` form)."""
    found = []
    for token in args:
        flag = table.flag_of(token)
        if flag is not None and flag.role in (Role.OWNED, Role.FORBIDDEN):
            found.append(token)
    return found
