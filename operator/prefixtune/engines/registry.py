"""Look up an engine adapter by name, and check extraArgs against what the operator owns."""

from __future__ import annotations

from collections.abc import Sequence

from prefixtune.engines._common import AdapterBase
from prefixtune.engines.base import ArgsError, EngineAdapter, EngineName
from prefixtune.engines.sglang import ADAPTER as SGLANG
from prefixtune.engines.sglang import SglangAdapter
from prefixtune.engines.trtllm import ADAPTER as TRTLLM
from prefixtune.engines.trtllm import TrtllmAdapter
from prefixtune.engines.vllm import ADAPTER as VLLM
from prefixtune.engines.vllm import VllmAdapter

Adapter = VllmAdapter | SglangAdapter | TrtllmAdapter
# One line per engine: adding one is an adapter module and a ``register`` call.
_ADAPTERS: dict[str, AdapterBase] = {}


def register(adapter: AdapterBase) -> AdapterBase:
    """Make ``adapter`` the one for its engine name (the built-in three register below)."""
    _ADAPTERS[str(adapter.name)] = adapter
    return adapter


def unregister(name: str) -> None:
    """Forget an engine (tests that register a stub engine)."""
    _ADAPTERS.pop(name, None)


for _adapter in (VLLM, SGLANG, TRTLLM):
    register(_adapter)

ENGINE_NAMES: tuple[str, ...] = tuple(str(name) for name in EngineName)


def _lookup(name: str | EngineName) -> AdapterBase:
    try:
        return _ADAPTERS[str(name).strip().lower()]
    except KeyError:
        known = ", ".join(_ADAPTERS)
        raise ValueError(f"unknown engine {name!r}; known engines: {known}") from None


def detect_engine(argv: Sequence[str]) -> EngineName | None:
    """The engine a command line starts (its adapter's command or an alias), or None."""
    return next((adapter.name for adapter in _ADAPTERS.values() if adapter.starts(argv)), None)


def get_adapter(name: str | EngineName) -> EngineAdapter:
    """The adapter for ``name`` (vllm | sglang | trtllm, case-insensitive); ValueError otherwise."""
    return _lookup(name)


def owned_args(engine: str | EngineName, args: Sequence[str]) -> list[str]:
    """Tokens of ``args`` that set a flag the operator owns, in either ``--x v`` or ``--x=v`` form."""
    return _lookup(engine).owned_args(args)


def extra_args_errors(engine: str | EngineName, args: Sequence[str]) -> list[str]:
    """Why ``args`` cannot be a ServingDeployment's extraArgs on ``engine`` (empty when they can).

    Checks both rules: no owned flag, and every flag known to the engine with a valid value (the
    args are rendered onto the default config and read back).
    """
    adapter = _lookup(engine)
    owned = adapter.owned_args(args)
    if owned:
        return [
            f"{adapter.name}: extraArgs may not set {token.split('=', 1)[0]}: the operator owns it"
            for token in owned
        ]
    try:
        adapter.render("model", adapter.default_config(), args)
    except ArgsError as exc:
        return [f"{adapter.name}: extraArgs: {exc}"]
    return []
