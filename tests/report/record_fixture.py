"""Record the report tests' fixture from a real run: the tuning policy driven against the twin.

    .venv/bin/python tests/report/record_fixture.py

Writes ``data/sdep-recorded.json`` (a ServingDeployment as the API server would return it, status
built by the controller's ``build_status``) and ``data/sdep-events.json`` (the Events the controller
would post for the policy's EmitEvent actions). The search space reaches down to a memory fraction
that cannot hold the weights, so some trials are infeasible (out of memory at start-up).
Not a test (no ``test_`` prefix); rerun it only to refresh the recorded data.
"""

from __future__ import annotations

import json
import sys
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parents[2]
sys.path.insert(0, str(ROOT))  # the bench package, when run as a script

from bench.tuner import TwinEnv, parse_scenario, settings_for  # noqa: E402
from prefixtune.controller.execute import event_body  # noqa: E402
from prefixtune.controller.status import build_status, validate_status  # noqa: E402
from prefixtune.metrics.diagnosis import diagnose  # noqa: E402
from prefixtune.tuning.actions import EmitEvent  # noqa: E402
from prefixtune.tuning.drive import drive  # noqa: E402

T0 = 1_780_000_000.0  # a fixed wall-clock origin for the virtual times
SCENARIO: dict[str, Any] = {
    "name": "report-fixture",
    "engine": "vllm",
    "model": "meta-llama/Llama-3.1-8B-Instruct",
    "gpu": "H100-80GB",
    "workload": "chatbot",
    "rate": 12.0,
    "objective": "goodput",
    "slo": {"ttft_p99_s": 2.0, "itl_p99_s": 0.15},
    "space": {"memory_fraction": [0.2, 0.95]},
    "warmup_s": 20,
    "measure_s": 40,
    "min_requests": 50,
}


def main() -> int:
    scenario = parse_scenario(SCENARIO, "record_fixture")
    settings = settings_for(scenario, "bo", 11, 0)
    env = TwinEnv(scenario)
    events: list[dict[str, Any]] = []
    body = {
        "apiVersion": "prefixtune.io/v1alpha1",
        "kind": "ServingDeployment",
        "metadata": {"name": "chat", "namespace": "demo", "uid": "0000-fixture", "generation": 1},
    }

    def on_step(state: Any, obs: Any, now: float, actions: list[Any]) -> None:
        for a in actions:
            if isinstance(a, EmitEvent):
                events.append(event_body(body, a, T0 + now))

    result = drive(scenario.engine, settings, scenario.start_config(), env, seed=0, on_step=on_step)
    state = result.state
    for t in state.trials:  # virtual time -> the fixed wall-clock origin
        t.started_at += T0
        if t.finished_at is not None:
            t.finished_at += T0
    last = next((t.signals for t in reversed(state.trials) if t.signals is not None), None)
    diagnosis = diagnose(last) if last is not None else None
    status = build_status(
        state, [], None, now=T0 + result.now, generation=1, ready=(True, "AllReplicasReady", ""),
        diagnosis=diagnosis,
    )  # fmt: skip
    validate_status(status)
    status.pop("policy")  # opaque and large; the views never read it
    resource = {
        **body,
        "spec": {
            "engine": scenario.engine,
            "model": scenario.model,
            "replicas": 1,
            "gpu": {"count": 1, "type": scenario.gpu},
            "tuning": {
                "mode": "auto",
                "objective": scenario.objective,
                "slo": {"ttftP99": "2s", "itlP99": "150ms"},
                "budget": {"maxTrials": 11},
            },
        },
        "status": status,
    }
    for i, e in enumerate(events):
        e["metadata"] = {**e["metadata"], "name": f"chat.{i:04d}"}
    data = Path(__file__).parent / "data"
    data.mkdir(exist_ok=True)
    (data / "sdep-recorded.json").write_text(json.dumps(resource, indent=1) + "\n")
    (data / "sdep-events.json").write_text(
        json.dumps({"kind": "EventList", "items": events}, indent=1) + "\n"
    )
    outcomes = [t.outcome for t in state.trials]
    print(f"{len(state.trials)} trials {outcomes}; {len(events)} events; phase {state.phase}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
