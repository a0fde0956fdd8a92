"""``prefixtune args``: print an engine's rendered command line as JSON.

    prefixtune args --engine vllm --model meta-llama/Llama-3.1-8B-Instruct \\
        --set blockSize=32 --set prefix_caching=false --tp 2 --extra-arg=--max-num-seqs=128

Engine flags in ``--extra-arg`` start with dashes, so give them as ``--extra-arg=--flag=value`` or
put them after a ``--``. Exit 2 on bad input, with a message naming the knob or flag and the
allowed values.
"""

from __future__ import annotations

import argparse
import json
import re
import sys
from collections.abc import Mapping, Sequence

from prefixtune.engines.base import KNOB_NAMES, ArgsError, KnobConfig, KnobSpec
from prefixtune.engines.knobs import BY_NAME, ENGINE_KNOB_NAMES, Restarts
from prefixtune.engines.registry import ENGINE_NAMES, get_adapter


class UsageError(ValueError):
    """Bad input to the CLI itself; main() prints it and exits 2."""


def knob_name(raw: str) -> str:
    """memory_fraction, memoryFraction and memory-fraction all name the same knob."""
    snake = re.sub(r"(?<=[a-z0-9])([A-Z])", r"_\1", raw.strip()).replace("-", "_").lower()
    if snake not in KNOB_NAMES:
        raise UsageError(f"--set: unknown knob {raw!r}; known knobs: {', '.join(ENGINE_KNOB_NAMES)}")
    if BY_NAME[snake].restarts is Restarts.ROUTER:
        raise UsageError(f"--set: {raw!r} is the router's knob (spec.routing), not an engine flag")
    return snake


def knob_value(knob: str, spec: KnobSpec, raw: str) -> object:
    """Text from the command line converted to the knob's type, then checked against its values."""
    text = raw.strip()
    value: object
    if spec.continuous:
        try:
            value = float(text)
        except ValueError:
            value = text
    elif isinstance(spec.choices[0], bool):
        lowered = text.lower()
        value = {"true": True, "on": True, "yes": True, "false": False, "off": False, "no": False}.get(
            lowered, text
        )
    elif isinstance(spec.choices[0], int):
        try:
            value = int(text)
        except ValueError:
            value = text
    else:
        value = text
    message = spec.validate(value)
    if message is not None:
        raise UsageError(f"--set {knob}: {message}")
    return value


def config_with(knobs: Mapping[str, KnobSpec], base: KnobConfig, settings: Sequence[str]) -> KnobConfig:
    values: dict[str, object] = dict(base.to_dict())
    for setting in settings:
        name, eq, raw = setting.partition("=")
        if not eq:
            raise UsageError(f"--set expects KNOB=VALUE, got {setting!r}")
        knob = knob_name(name)
        values[knob] = knob_value(knob, knobs[knob], raw)
    return KnobConfig.from_dict(values)


def _parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(
        prog="prefixtune args",
        description="Print an engine's command line for a knob config as JSON (engine, model, command, args, "
        "argv, files).",
        epilog="Engine flags start with dashes: pass them as --extra-arg=--flag=value or after '--'.",
    )
    parser.add_argument("--engine", required=True, choices=ENGINE_NAMES, help="serving engine")
    parser.add_argument("--model", required=True, help="model name or path")
    parser.add_argument(
        "--set",
        dest="settings",
        action="append",
        default=[],
        metavar="KNOB=VALUE",
        help=f"set a knob ({', '.join(ENGINE_KNOB_NAMES)}; camelCase accepted); engine defaults otherwise",
    )
    parser.add_argument("--tp", type=int, default=1, help="tensor parallel degree (default 1)")
    parser.add_argument("--port", type=int, default=None, help="HTTP port (default: the engine's)")
    parser.add_argument(
        "--extra-arg",
        dest="extra_args",
        action="append",
        default=[],
        metavar="ARG",
        help="untuned engine arg",
    )
    return parser


def main(argv: Sequence[str]) -> int:
    args_in = list(argv)
    trailing: list[str] = []
    if "--" in args_in:
        cut = args_in.index("--")
        args_in, trailing = args_in[:cut], args_in[cut + 1 :]
    try:
        ns = _parser().parse_args(args_in)
    except SystemExit as exc:  # argparse already printed its message
        return int(exc.code or 0)
    adapter = get_adapter(ns.engine)
    try:
        config = config_with(adapter.knobs(), adapter.default_config(), ns.settings)
        rendered = adapter.render(
            ns.model, config, [*ns.extra_args, *trailing], port=ns.port, tensor_parallel=ns.tp
        )
    except (UsageError, ArgsError) as exc:
        print(f"prefixtune args: error: {exc}", file=sys.stderr)
        return 2
    document = {
        "engine": str(adapter.name),
        "model": ns.model,
        "config": {name: value for name, value in config.to_dict().items() if name in ENGINE_KNOB_NAMES},
        "command": list(rendered.command),
        "args": list(rendered.args),
        "argv": list(rendered.argv),
        "files": dict(rendered.files),
    }
    print(json.dumps(document, indent=2))
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
