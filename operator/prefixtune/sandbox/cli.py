"""``prefixtune sandbox up``: the local sandbox cluster in the foreground.

::

    prefixtune sandbox up [--port P] [--host 127.0.0.1] [--kubeconfig FILE] [--clock-file FILE]
                          [--speedup K] [--demo-timings] [--prometheus auto|on|off]
                          [--startup-delay S] [--no-load] [--seed N]

Starts the emulated API server, the Deployment/ReplicaSet/Endpoints controllers, the twin kubelet,
the load generators and (when asked and installed) Prometheus; writes a kubeconfig; prints how to use
it; runs until SIGINT/SIGTERM, then stops everything and exits 0.
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import signal
import sys
from collections.abc import Sequence
from pathlib import Path

from prefixtune.sandbox.kubelet import KubeletConfig
from prefixtune.sandbox.profile import DemoTimings
from prefixtune.sandbox.up import PROMETHEUS_MODES, SandboxOptions, sandbox, usage_text


def _positive(text: str) -> float:
    try:
        value = float(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"must be a number > 0, got {text!r}") from None
    if not value > 0:
        raise argparse.ArgumentTypeError(f"must be > 0, got {text!r}")
    return value


def _non_negative(text: str) -> float:
    try:
        value = float(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"must be a number >= 0, got {text!r}") from None
    if value < 0:
        raise argparse.ArgumentTypeError(f"must be >= 0, got {text!r}")
    return value


def _port(text: str) -> int:
    try:
        value = int(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"must be a port number 0..65535, got {text!r}") from None
    if not 0 <= value <= 65535:
        raise argparse.ArgumentTypeError(f"must be a port number 0..65535 (0: a free one), got {text!r}")
    return value


def _parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(
        prog="prefixtune sandbox up",
        description="Run a local Kubernetes-like cluster whose pods are digital twins of LLM engines.",
    )
    p.add_argument("--port", type=_port, default=0, help="API server port (default: a free port)")
    p.add_argument("--host", default="127.0.0.1", help="API server address (default 127.0.0.1)")
    p.add_argument(
        "--kubeconfig", type=Path, help="where to write the kubeconfig (default: ./sandbox.kubeconfig)"
    )
    p.add_argument(
        "--clock-file",
        type=Path,
        help="where to publish the sandbox clock and speed-up for prefixtune run --clock-file "
        "(default: a temporary file, printed)",
    )
    p.add_argument("--namespace", default="default", help="the kubeconfig's namespace (default: default)")
    p.add_argument(
        "--speedup", type=_positive, default=1.0, help="sandbox seconds per wall second (default 1)"
    )
    p.add_argument(
        "--demo-timings",
        action="store_true",
        help="admit every ServingDeployment with demo timings (2s warm-up, 8s windows, 5 trials, "
        "direct scrapes, a light load: sandbox/profile.py), as a mutating webhook would: it tunes in "
        "minutes instead of hours",
    )
    p.add_argument(
        "--prometheus", choices=PROMETHEUS_MODES, default="auto", help="run a real Prometheus (default auto)"
    )
    p.add_argument(
        "--scrape-interval",
        type=_positive,
        default=1.0,
        help="Prometheus scrape interval, wall seconds (default 1)",
    )
    p.add_argument(
        "--startup-delay",
        type=_non_negative,
        default=KubeletConfig.startup_delay_s,
        help="engine start-up time before Ready, in sandbox seconds (default %(default)g)",
    )
    p.add_argument("--no-load", action="store_true", help="do not run the load generators")
    p.add_argument("--seed", type=int, default=0, help="seed of the load and the twins (default 0)")
    p.add_argument("-v", "--verbose", action="store_true", help="log the controllers' warnings")
    return p


def main(argv: Sequence[str]) -> int:
    args = list(argv)
    if not args or args[0] in {"-h", "--help"}:
        print("usage: prefixtune sandbox up [options]   (prefixtune sandbox up --help for the options)")
        return 0
    if args[0] != "up":
        print(f"prefixtune sandbox: unknown command {args[0]!r}; the only command is 'up'", file=sys.stderr)
        return 2
    opts = _parser().parse_args(args[1:])
    if opts.verbose:
        import logging

        logging.basicConfig(level=logging.INFO, format="%(asctime)s %(name)s %(levelname)s %(message)s")
        logging.getLogger("aiohttp.access").setLevel(logging.WARNING)  # one line per API call otherwise
    try:
        return asyncio.run(_up(opts))
    except (ValueError, FileNotFoundError, OSError, RuntimeError) as err:
        print(f"prefixtune sandbox up: {err}", file=sys.stderr)
        return 1


async def _up(opts: argparse.Namespace) -> int:
    kubeconfig = opts.kubeconfig or Path("sandbox.kubeconfig")
    config = KubeletConfig(startup_delay_s=opts.startup_delay)
    stop = asyncio.Event()
    loop = asyncio.get_running_loop()
    for sig in (signal.SIGINT, signal.SIGTERM):
        with contextlib.suppress(NotImplementedError, RuntimeError):
            loop.add_signal_handler(sig, stop.set)
    options = SandboxOptions(
        port=opts.port,
        host=opts.host,
        kubeconfig=kubeconfig,
        clock_file=opts.clock_file,
        demo_timings=DemoTimings() if opts.demo_timings else None,
        namespace=opts.namespace,
        speedup=opts.speedup,
        prometheus=opts.prometheus,
        scrape_interval_s=opts.scrape_interval,
        load=not opts.no_load,
        config=config,
        seed=opts.seed,
    )
    async with sandbox(options) as sb:
        print(usage_text(sb), flush=True)
        await stop.wait()
        print("prefixtune sandbox: stopping", file=sys.stderr, flush=True)
    return 0
