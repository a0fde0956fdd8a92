"""Adopting an existing engine Deployment (``spec.adopt``): who may take it, where it starts, what
the operator writes in it, and what it is left with when the resource goes.

Pure functions over plain dicts; ``reconcile.py`` and ``execute.py`` call them.

- **Opt-in.** The Deployment is taken only when it carries ``prefixtune.io/adopt: <resource
  name>`` and no controller owns it: the opt-in names the resource that may take it, so naming
  another team's Deployment in a spec takes nothing (``opt_in_problems``). Without it, the
  operator writes nothing at all and says why (``AdoptionRefused``).
- **Starting point.** The engine container's command (``command`` + ``args``) is parsed by the
  engine's adapter: its knobs are the starting config, its other flags the extra args, its image
  and tensor-parallel degree those of the spec (``adopted_spec``). A command the parser refuses
  touches nothing either.
- **Ownership without an ownerReference.** The garbage collector deletes a dependent once its last
  owner is gone, whatever the operator does or whether it runs (there is no finalizer by design),
  so the adopted Deployment gets no ownerReference: the opt-in annotation, which its owner wrote
  and the operator never writes, is the claim (``claim_adopted``). Deleting the resource therefore
  deletes what the operator created (canary Deployment, Service, ConfigMaps) and leaves the
  adopted Deployment, with the operator down as with it up.
- **Only the best config in place.** Trials run beside the adopted pods, on the operator's canary
  Deployment (``rules._check_adopt``), and the adopted Deployment is rendered only from the stable
  config (``released_config``): the baseline, then each config measured best. So whenever the
  resource is deleted, the Deployment runs the best config so far, never a trial's.
- **Owned fields, and the rest.** In the adopted Deployment the operator owns ``spec.replicas``,
  the engine container's ``command`` and ``args``, and its own pod-template labels and annotations
  (``overlay``); everything else (image, env, volumes, resources, probes, node selection, the
  selector, the strategy) stays the owner's, is copied from the live object at every rendering, and
  is therefore never drift. The canary is a copy of the adopted pod template with the trial's
  command, so a trial differs from the stable pods in its knobs only.
"""

from __future__ import annotations

import copy
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Any

from prefixtune.api import validate_spec
from prefixtune.api.models import ConfigSpec, ServingDeploymentSpec
from prefixtune.api.validation import secret_values
from prefixtune.controller.observe import desired
from prefixtune.controller.ownership import Claim, controller_of, describe_controller
from prefixtune.controller.render import (
    DeploymentRole,
    Owner,
    render_command,
    render_deployment,
)
from prefixtune.engines import get_adapter
from prefixtune.engines.base import ArgsError, KnobConfig
from prefixtune.engines.registry import detect_engine
from prefixtune.tuning.state import PolicyState

ADOPT_ANNOTATION = "prefixtune.io/adopt"
REFUSED_REASON = "AdoptionRefused"  # the Ready condition's and the Warning Event's reason
# What a user spec may not set with spec.adopt: the adopted command sets it.
FROM_COMMAND = ("config", "extraArgs", "image")


@dataclass(frozen=True)
class Adopted:
    """An adoption that may go ahead."""

    spec: ServingDeploymentSpec  # the resource's spec with the command's config, flags, image, GPUs
    raw: dict[str, Any]  # the same as a raw spec (stored as the last valid spec)
    container: str  # the engine container's name


def _meta(obj: Mapping[str, Any] | None) -> Mapping[str, Any]:
    return (obj or {}).get("metadata") or {}


def opt_in_problems(
    deployment: Mapping[str, Any] | None, namespace: str, name: str, target: str
) -> list[str]:
    """Why the resource ``namespace/name`` may not take the Deployment ``target`` (empty: it may)."""
    where = f"Deployment {namespace}/{target}"
    if deployment is None:
        return [f"spec.adopt.deployment: {where} does not exist (create it, or fix the name)"]
    meta = _meta(deployment)
    if str(meta.get("namespace") or namespace) != namespace or str(meta.get("name") or "") != target:
        return [f"spec.adopt.deployment: {where} is not the object read (a Deployment of another namespace)"]
    problems = []
    opted = (meta.get("annotations") or {}).get(ADOPT_ANNOTATION)
    if opted is None:
        problems.append(
            f"{where} does not opt in: it needs the annotation {ADOPT_ANNOTATION}={name} (kubectl annotate "
            f"deployment {target} {ADOPT_ANNOTATION}={name}); nothing was changed"
        )
    elif opted != name:
        problems.append(
            f"{where} opts in to another resource ({ADOPT_ANNOTATION} names a different "
            f"ServingDeployment, not {name!r}); nothing was changed"
        )
    if controller_of(deployment) is not None:
        problems.append(
            f"{where} is {describe_controller(deployment)}: its controller would undo every change"
        )
    return problems


def claim_adopted(obj: Mapping[str, Any], owner: Owner) -> Claim:
    """The operator's relation to the Deployment it adopts: ours while it opts in to this resource
    and no controller owns it (never an orphan to add an ownerReference to)."""
    if owner.adopted is None or _meta(obj).get("name") != owner.adopted:
        return Claim.FOREIGN
    return (
        Claim.OURS if not opt_in_problems(obj, owner.namespace, owner.name, owner.adopted) else Claim.FOREIGN
    )


def _argv(container: Mapping[str, Any]) -> list[str]:
    return [str(t) for t in [*(container.get("command") or []), *(container.get("args") or [])]]


def engine_container(deployment: Mapping[str, Any]) -> Mapping[str, Any] | None:
    """The first container whose command line starts an engine (vllm serve, sglang, trtllm-serve)."""
    containers = (((deployment.get("spec") or {}).get("template") or {}).get("spec") or {}).get("containers")
    for container in containers or []:
        if isinstance(container, Mapping) and detect_engine(_argv(container)) is not None:
            return container
    return None


def _redacted(text: str, argv: Sequence[str]) -> str:
    for value in secret_values({"extraArgs": list(argv)}):
        text = text.replace(value, "***")
    return text


def adopted_spec(
    raw_spec: Mapping[str, Any], deployment: Mapping[str, Any], start: KnobConfig | None = None
) -> tuple[Adopted | None, list[str]]:
    """The resource's spec with what the adopted Deployment runs: the knobs of its engine command
    (``start`` instead, once tuning has begun: the policy keeps the config it started from, while the
    live command runs the best one), its other flags as extra args, its image, and its
    tensor-parallel degree as the GPU count. Problems name what refused it."""
    name = str(_meta(deployment).get("name") or "")
    engine = str(raw_spec.get("engine") or "")
    given = [key for key in FROM_COMMAND if raw_spec.get(key) not in (None, [], {})]
    problems = [
        f"spec.{key}: set by the adopted Deployment's command; omit it with spec.adopt" for key in given
    ]
    container = engine_container(deployment)
    if container is None:
        problems.append(
            f"Deployment {name}: no container's command + args starts an engine ({engine} expected; "
            "the command must be spelt in the pod spec, not left to the image's entrypoint or a shell)"
        )
        return None, problems
    argv = _argv(container)
    detected = detect_engine(argv)
    if detected is not None and str(detected) != engine:
        problems.append(f"Deployment {name}: its container runs {detected}, spec.engine is {engine}")
        return None, problems
    adapter = get_adapter(engine)
    try:
        parsed = adapter.parse(argv)
    except ArgsError as err:
        problems.append(_redacted(f"Deployment {name}: its engine command does not parse: {err}", argv))
        return None, problems
    if parsed.model != raw_spec.get("model"):
        problems.append(
            f"Deployment {name}: its command serves model {parsed.model!r}, "
            f"spec.model is {raw_spec.get('model')!r}"
        )
    if parsed.port != adapter.metrics_port:
        problems.append(
            f"Deployment {name}: its engine listens on port {parsed.port}; adopted engines must serve on "
            f"{adapter.metrics_port}, where the operator scrapes and its Service sends traffic"
        )
    # The GPUs per pod follow the command's tensor-parallel degree (the API server defaults
    # spec.gpu.count to 1, so a value there says nothing about what the user meant).
    gpu = dict(raw_spec.get("gpu") or {})
    if problems:
        return None, problems
    config = start if start is not None else parsed.config
    raw = {
        **raw_spec,
        "config": ConfigSpec.from_knob_config(config).to_dict(),
        "extraArgs": list(parsed.extra_args),
        "image": str(container.get("image") or ""),
        "gpu": {**gpu, "count": parsed.tensor_parallel},
    }
    spec, errors = validate_spec(raw)
    if spec is None or errors:
        return None, [_redacted(f"Deployment {name}: its engine command: {e}", argv) for e in errors]
    if render_command(spec, config).files:
        return None, [
            f"Deployment {name}: {engine} reads its options from a file; adopting it is not supported "
            "(the operator would have to mount its ConfigMap into the adopted pods)"
        ]
    return Adopted(spec, raw, str(container.get("name") or "")), []


def overlay(
    live: Mapping[str, Any], rendered: Mapping[str, Any], role: DeploymentRole, container: str
) -> dict[str, Any]:
    """The engine Deployment of ``role`` for an adopted resource: the live adopted Deployment's spec
    with the operator's owned fields from ``rendered`` (replicas, the engine container's command and
    args, the operator's pod-template labels and annotations). The baseline keeps the live name,
    labels, selector and strategy and gets no ownerReference; the canary keeps the rendering's
    metadata, selector and strategy (an object the operator creates and owns)."""
    spec = copy.deepcopy(dict(live.get("spec") or {}))
    want = rendered["spec"]
    spec["replicas"] = want["replicas"]
    template = spec.setdefault("template", {})
    meta = template.setdefault("metadata", {})
    want_meta = want["template"]["metadata"]
    meta["labels"] = {**(meta.get("labels") or {}), **want_meta["labels"]}
    meta["annotations"] = {**(meta.get("annotations") or {}), **want_meta["annotations"]}
    engine = want["template"]["spec"]["containers"][0]
    for item in (template.get("spec") or {}).get("containers") or []:
        if isinstance(item, dict) and item.get("name") == container:
            item["command"], item["args"] = list(engine["command"]), list(engine["args"])
    if role == "canary":
        spec["selector"], spec["strategy"] = want["selector"], want["strategy"]
        metadata = copy.deepcopy(dict(rendered["metadata"]))
    else:
        live_meta = _meta(live)
        metadata = {
            "name": live_meta.get("name"),
            "namespace": live_meta.get("namespace"),
            "labels": dict(live_meta.get("labels") or {}),
        }
    return {"apiVersion": "apps/v1", "kind": "Deployment", "metadata": metadata, "spec": spec}


def render_engine_deployment(
    owner: Owner,
    spec: ServingDeploymentSpec,
    config: KnobConfig,
    role: DeploymentRole,
    replicas: int,
    adopted: Mapping[str, Any] | None,
) -> dict[str, Any]:
    """The engine Deployment of ``role``: the operator's own rendering, or, for an adopted resource
    (``adopted``: the live adopted Deployment), that rendering laid over the adopted one."""
    rendered = render_deployment(owner, spec, config, role, replicas)
    if adopted is None:
        return rendered
    return overlay(adopted, rendered, role, engine_name(adopted) or "")


def engine_name(deployment: Mapping[str, Any]) -> str | None:
    found = engine_container(deployment)
    return None if found is None else str(found.get("name") or "")


def released_config(state: PolicyState) -> KnobConfig:
    """What the adopted Deployment runs, and keeps when the resource is deleted at this moment:
    the config rendered into it, the stable one (``observe.desired``'s baseline). With trials
    beside it (``rules._check_adopt``) this is the baseline or a config measured best, never the
    config of a trial in flight."""
    return desired(state).baseline
