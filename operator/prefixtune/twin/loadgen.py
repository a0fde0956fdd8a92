"""An open-loop HTTP load generator: sends a workload's requests to engines at their arrival times.

``run_load(requests, targets, speedup=K)`` sends each ``Request`` at ``arrival_s / K`` wall seconds
after the start (a twin served with ``--speedup K`` then sees it at its simulated arrival time) to
one of ``targets`` (base URLs), chosen per request like a Kubernetes Service does (kube-proxy picks
a backend per connection with no session affinity): ``random`` (seeded) or ``round-robin``. Turns of
one session are therefore independent and may land on different replicas.

Each request is ``POST /v1/completions`` with the prompt as token ids (``TokenSeq.to_tokens``) and
``max_tokens`` = the output length. With ``output_identity`` (default on) it also sends the twin's
extension ``"prefixtune": {"output_token_ids": [...]}``: the ids of the request's output as the
workload defines them, so the next turn's prompt (which contains them) can hit what this one cached.
Real engines ignore unknown fields only in some versions: turn it off against a real server.

The run is bounded by ``max_requests`` and ``max_duration_s`` (wall seconds of sending), and at most
``max_in_flight`` requests are open at once (the rest are counted as ``dropped``). It returns one
``Record`` per request sent (plain Python values), in request order.
"""

from __future__ import annotations

import asyncio
import math
import random
import time
from collections.abc import Callable, Sequence
from dataclasses import asdict, dataclass
from typing import Any, Literal

import aiohttp

from prefixtune.twin.openai_api import error_message
from prefixtune.twin.request import Request

Balance = Literal["random", "round-robin"]


@dataclass(frozen=True)
class Record:
    """What the client saw for one request."""

    req_id: int
    session: int | None
    kind: str
    target: str
    scheduled_s: float  # when it was due (wall seconds from the start)
    sent_s: float  # when it was sent
    status: int  # HTTP status; 0 when the connection failed
    latency_s: float  # send to the end of the response
    prompt_tokens: int = 0
    completion_tokens: int = 0
    cached_tokens: int = 0
    error: str = ""

    @property
    def ok(self) -> bool:
        return self.status == 200

    def to_dict(self) -> dict[str, Any]:
        return asdict(self)


def completion_body(req: Request, model: str | None, output_identity: bool = True) -> dict[str, Any]:
    """The ``/v1/completions`` request for ``req`` (token ids from its prefix identity)."""
    tokens = req.seq.to_tokens()
    body: dict[str, Any] = {"prompt": tokens[: req.prompt_len], "max_tokens": req.output_len}
    if model is not None:
        body["model"] = model
    if output_identity:
        out = tokens[req.prompt_len : req.prompt_len + req.output_len]
        if len(out) == req.output_len:
            body["prefixtune"] = {"output_token_ids": out}
    return body


class _Picker:
    def __init__(self, targets: Sequence[str], balance: Balance, seed: int) -> None:
        if not targets:
            raise ValueError("targets: give at least one base URL")
        if balance not in ("random", "round-robin"):
            raise ValueError(f"balance must be 'random' or 'round-robin'; got {balance!r}")
        self.targets = [t.rstrip("/") for t in targets]
        self.balance = balance
        self.rng = random.Random(seed)
        self.next = 0

    def pick(self) -> str:
        if self.balance == "random":
            return self.rng.choice(self.targets)
        t = self.targets[self.next % len(self.targets)]
        self.next += 1
        return t


async def run_load(
    requests: Sequence[Request],
    targets: Sequence[str],
    *,
    speedup: float = 1.0,
    model: str | None = None,
    balance: Balance = "random",
    seed: int = 0,
    max_requests: int | None = None,
    max_duration_s: float | None = None,
    max_in_flight: int = 1024,
    timeout_s: float = 600.0,
    output_identity: bool = True,
    session: aiohttp.ClientSession | None = None,
    clock: Callable[[], float] = time.monotonic,
) -> list[Record]:
    """Send ``requests`` (sorted by arrival) and return the records of those sent. Arrivals are
    paced on ``clock`` (seconds): the wall clock, or the clock a twin runs on (a sandbox clock that
    drops a busy machine's stalls), so that a slowed twin is offered its load at its own pace."""
    if not speedup > 0:
        raise ValueError(f"speedup must be > 0; got {speedup}")
    if max_requests is not None and max_requests < 0:
        raise ValueError(f"max_requests must be >= 0; got {max_requests}")
    if max_in_flight < 1:
        raise ValueError(f"max_in_flight must be >= 1; got {max_in_flight}")
    picker = _Picker(targets, balance, seed)
    todo = sorted(requests, key=lambda r: (r.arrival_s, r.req_id))
    if max_requests is not None:
        todo = todo[:max_requests]
    horizon = math.inf if max_duration_s is None else max_duration_s
    own = session is None
    sess = session or aiohttp.ClientSession(
        connector=aiohttp.TCPConnector(limit=max_in_flight),
        timeout=aiohttp.ClientTimeout(total=timeout_s),
    )
    records: list[Record] = []
    tasks: list[asyncio.Task[Record]] = []
    in_flight = 0
    t0 = clock()

    async def send(req: Request, target: str, due: float) -> Record:
        nonlocal in_flight
        sent = clock() - t0
        try:
            async with sess.post(
                f"{target}/v1/completions", json=completion_body(req, model, output_identity)
            ) as resp:
                data = await resp.json(content_type=None)
                status = resp.status
        except (TimeoutError, aiohttp.ClientError, ValueError) as err:
            return Record(
                req.req_id,
                req.session,
                req.kind,
                target,
                due,
                sent,
                0,
                clock() - t0 - sent,
                error=f"{type(err).__name__}: {err}",
            )
        finally:
            in_flight -= 1
        latency = clock() - t0 - sent
        if status != 200 or not isinstance(data, dict):
            message = error_message(data)
            return Record(
                req.req_id, req.session, req.kind, target, due, sent, status, latency, error=str(message)
            )
        usage = data.get("usage") or {}
        details = usage.get("prompt_tokens_details") or {}
        return Record(
            req.req_id,
            req.session,
            req.kind,
            target,
            due,
            sent,
            status,
            latency,
            prompt_tokens=int(usage.get("prompt_tokens", 0)),
            completion_tokens=int(usage.get("completion_tokens", 0)),
            cached_tokens=int(details.get("cached_tokens") or 0),
        )

    try:
        for req in todo:
            due = req.arrival_s / speedup
            if due >= horizon:
                break
            while (delay := due - (clock() - t0)) > 0:  # a clock slower than the wall: sleep again
                await asyncio.sleep(delay)
            if clock() - t0 >= horizon:
                break
            target = picker.pick()
            if in_flight >= max_in_flight:
                records.append(
                    Record(
                        req.req_id,
                        req.session,
                        req.kind,
                        target,
                        due,
                        clock() - t0,
                        0,
                        0.0,
                        error="dropped",
                    )
                )
                continue
            in_flight += 1
            tasks.append(asyncio.create_task(send(req, target, due)))
        if tasks:
            records.extend(await asyncio.gather(*tasks))
    finally:
        for t in tasks:
            t.cancel()
        if own:
            await sess.close()
    records.sort(key=lambda r: r.req_id)
    return records


def summarize_records(records: Sequence[Record]) -> dict[str, Any]:
    """Client-side totals: counts, token hit fraction from ``cached_tokens``, latency percentiles."""
    ok = [r for r in records if r.ok]
    lat = sorted(r.latency_s for r in ok)
    prompt = sum(r.prompt_tokens for r in ok)

    def pct(q: float) -> float:
        if not lat:
            return 0.0
        return float(lat[min(len(lat) - 1, max(0, math.ceil(q * len(lat)) - 1))])

    by_target: dict[str, int] = {}
    for r in records:
        by_target[r.target] = by_target.get(r.target, 0) + 1
    return {
        "sent": len(records),
        "ok": len(ok),
        "errors": len(records) - len(ok),
        "prompt_tokens": prompt,
        "completion_tokens": sum(r.completion_tokens for r in ok),
        "cached_tokens": sum(r.cached_tokens for r in ok),
        "cached_fraction": (sum(r.cached_tokens for r in ok) / prompt) if prompt else 0.0,
        "latency_p50_s": pct(0.5),
        "latency_p99_s": pct(0.99),
        "by_target": by_target,
    }
