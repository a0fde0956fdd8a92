"""The ``prefixtune`` command. Each subcommand lives with its concern; this module only dispatches."""

from __future__ import annotations

import importlib
import sys
from collections.abc import Callable, Sequence

# subcommand -> (module, function, one-line help). The function takes the remaining argv and
# returns an exit code. Modules are imported lazily so ``prefixtune crd`` does not import skopt.
SUBCOMMANDS: dict[str, tuple[str, str, str]] = {
    "crd": ("prefixtune.api.crd", "main", "print the ServingDeployment CustomResourceDefinition"),
    "args": ("prefixtune.engines.cli", "main", "print an engine's rendered command line as JSON"),
    "render": (
        "prefixtune.controller.dryrun_cli",
        "main",
        "dry run: the Deployment, Service, ConfigMap the operator would create",
    ),
    "twin": ("prefixtune.twin.cli", "main", "digital twin: run | serve | cache | whatif"),
    "bench": ("prefixtune.benchcli", "main", "run a benchmark from bench/ (twin | tuner | ...)"),
    "run": ("prefixtune.controller.operator", "main", "run the operator (kopf) against a cluster"),
    "demo": ("prefixtune.demo", "main", "sandbox + operator + examples: watch it tune (make demo)"),
    "sandbox": ("prefixtune.sandbox.cli", "main", "run the local sandbox cluster"),
    "status": ("prefixtune.report.status_view", "main", "show ServingDeployments: phase, trials, best"),
    "report": ("prefixtune.report.report", "main", "write an HTML report with plots of a ServingDeployment"),
    "pause": (
        "prefixtune.control",
        "pause",
        "pause tuning (spec.tuning.paused); the stable config runs",
    ),
    "resume": ("prefixtune.control", "resume", "resume a paused tuning run in its epoch"),
    "pin": ("prefixtune.control", "pin", 'run trial N\'s (or the best) config, tuning "off" (spec.config)'),
    "rollback": ("prefixtune.control", "rollback", 'back to the spec\'s config: tuning.mode "off"'),
    "approve": (
        "prefixtune.control",
        "approve",
        "roll observe mode's recommendation out once",
    ),
}


def _usage() -> str:
    lines = ["usage: prefixtune <command> [options]", "", "commands:"]
    width = max(len(name) for name in SUBCOMMANDS)
    for name, (_, _, help_text) in SUBCOMMANDS.items():
        lines.append(f"  {name.ljust(width)}  {help_text}")
    lines.append("")
    lines.append("Run 'prefixtune <command> --help' for a command's options.")
    return "\n".join(lines)


def main(argv: Sequence[str] | None = None) -> int:
    args = list(sys.argv[1:] if argv is None else argv)
    if not args or args[0] in {"-h", "--help", "help"}:
        print(_usage())
        return 0
    if args[0] == "--version":
        from prefixtune import __version__

        print(__version__)
        return 0
    name, rest = args[0], args[1:]
    if name not in SUBCOMMANDS:
        print(f"prefixtune: unknown command {name!r}\n\n{_usage()}", file=sys.stderr)
        return 2
    module_name, func_name, _ = SUBCOMMANDS[name]
    func: Callable[[list[str]], int] = getattr(importlib.import_module(module_name), func_name)
    return int(func(rest) or 0)


if __name__ == "__main__":
    sys.exit(main())
