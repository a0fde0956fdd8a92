"""Any GPU type (issue #18, item 1): accepted by the API, its node selector, and where the twin
has no model of it, the engine's own defaults and a note in the status and from ``prefixtune render``
(tuning then works from measurements only)."""

from __future__ import annotations

import io
import json
from typing import Any

import kubernetes_validate
import pytest

from prefixtune.api import parse_spec
from prefixtune.api.rules import gpu_notes
from prefixtune.controller import dryrun_cli
from prefixtune.controller import render as R
from prefixtune.controller import status as S
from prefixtune.engines import get_adapter
from prefixtune.tuning.policy import initial_state
from prefixtune.tuning.settings import TuningSettings

OWNER = R.Owner(namespace="team", name="rag", uid="uid-1")
MODEL = "meta-llama/Llama-3.1-8B-Instruct"
KUBE = kubernetes_validate.utils.latest_version()


def _spec(**extra: Any) -> Any:
    return parse_spec({"engine": "vllm", "model": MODEL, **extra})


def _pod(dep: dict[str, Any]) -> tuple[dict[str, Any], dict[str, Any], dict[str, Any]]:
    template = dep["spec"]["template"]
    (container,) = template["spec"]["containers"]
    return template["metadata"], template["spec"], container


def _deployment(spec: Any) -> dict[str, Any]:
    dep = R.render_deployment(OWNER, spec, spec.knob_config(), "baseline", 1)
    kubernetes_validate.validate(dep, KUBE, strict=True)
    return dep


def _doc(**spec: Any) -> dict[str, Any]:
    return {
        "apiVersion": "prefixtune.io/v1alpha1",
        "kind": "ServingDeployment",
        "metadata": {"name": "rag", "namespace": "team"},
        "spec": {"engine": "vllm", "model": MODEL, **spec},
    }


def _render(argv: list[str], doc: dict[str, Any]) -> tuple[int, str, str]:
    out, err = io.StringIO(), io.StringIO()
    rc = dryrun_cli.run(argv, io.StringIO(json.dumps(doc)), out, err)
    return rc, out.getvalue(), err.getvalue()


@pytest.mark.parametrize("gpu", ["NVIDIA-B200", "NVIDIA-L40S", "NVIDIA-H100-PCIe", "h200"])
def test_any_gpu_type_is_accepted(gpu: str) -> None:
    spec = parse_spec({"engine": "vllm", "model": MODEL, "gpu": {"type": gpu}})
    assert spec.gpu.type == gpu


def test_an_unknown_gpu_gets_the_engine_defaults_and_a_note_a_known_one_its_own() -> None:
    adapter = get_adapter("sglang")
    b200 = parse_spec({"engine": "sglang", "model": MODEL, "gpu": {"type": "NVIDIA-B200"}})
    h200 = parse_spec({"engine": "sglang", "model": MODEL, "gpu": {"type": "H200"}})
    assert b200.knob_config() == adapter.default_config()
    assert h200.knob_config() != adapter.default_config()  # SGLang's memory fraction follows the GPU
    (note,) = gpu_notes(b200)
    assert note.startswith("no twin model for GPU 'NVIDIA-B200' (the twin models H100-80GB, H200, A100-80GB)")
    assert "tuning works from measurements only" in note
    assert gpu_notes(h200) == []
    assert gpu_notes(parse_spec({"engine": "sglang", "model": MODEL, "gpu": {"type": "nvidia-h200"}})) == []


@pytest.mark.parametrize(
    ("gpu", "product"),
    [
        ("H200", "NVIDIA-H200"),
        ("h200", "NVIDIA-H200"),  # a name the twin knows, in another spelling: the same node label
        ("NVIDIA-A100-SXM4-80GB", "NVIDIA-A100-SXM4-80GB"),
        ("NVIDIA-B200", "NVIDIA-B200"),  # unknown to the twin: GPU feature discovery's name as written
        ("NVIDIA-L40S", "NVIDIA-L40S"),
    ],
)
def test_the_node_selector_follows_the_gpu_type(gpu: str, product: str) -> None:
    _, pod, _ = _pod(_deployment(_spec(gpu={"type": gpu})))
    assert pod["nodeSelector"] == {"nvidia.com/gpu.product": product}


def test_render_of_an_unknown_gpu_prints_the_objects_and_says_the_twin_has_no_model() -> None:
    rc, out, err = _render(["-f", "-"], _doc(gpu={"type": "NVIDIA-B200"}, tuning={"mode": "off"}))
    assert rc == 0
    assert "nvidia.com/gpu.product: NVIDIA-B200" in out
    assert "note: no twin model for GPU 'NVIDIA-B200'" in err
    rc, _, err = _render(["-f", "-"], _doc(gpu={"type": "H200"}))
    assert rc == 0 and err == ""


def test_the_status_notes_an_unknown_gpu_before_any_window() -> None:
    spec = _spec(gpu={"type": "NVIDIA-B200"})
    state = initial_state("vllm", TuningSettings(), spec.knob_config())
    status = S.build_status(
        state, [], None, now=1.0, generation=1, ready=(True, "R", ""), notes=gpu_notes(spec)
    )
    assert status["diagnosis"]["bound"] == "unknown"
    assert status["diagnosis"]["notes"][0].startswith("no twin model for GPU 'NVIDIA-B200'")
    S.validate_status(status)
    again = S.build_status(
        state, [], status, now=2.0, generation=1, ready=(True, "R", ""), notes=gpu_notes(spec)
    )
    assert again["diagnosis"]["notes"] == status["diagnosis"]["notes"]  # once, not once per tick
    plain = S.build_status(state, [], None, now=1.0, generation=1, ready=(True, "R", ""))
    assert plain["diagnosis"] is None
