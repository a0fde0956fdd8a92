"""A dry run: the objects the operator would create for a ServingDeployment, without a cluster.

``render_objects(doc)`` takes one parsed document (a ServingDeployment as ``kubectl apply`` would
send it) and returns ``(objects, problems)``: the children the operator creates for the spec's
starting config (``spec.config``, engine defaults filled in) before any trial, or the reasons it
would refuse the resource, never both. Nothing is decided here: the checks are the operator's own
(``validate_spec``, the name rules, the admin's policy when one is given), the objects come from
``render`` and carry the annotation ``execute.annotated`` adds, the replicas from ``scale_plan``.

With ``spec.adopt`` the baseline Deployment is the existing one, which only the cluster holds: it is
not rendered (its starting config is its own command's). What only the cluster knows is left as it
is on a fresh resource: the owner reference's uid is the
document's ``metadata.uid`` or ``UID_PLACEHOLDER`` (the API server assigns it on create), and the
ServiceMonitor is rendered only when asked (the operator creates it only where its CRD exists).
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

from prefixtune.api.models import API_GROUP, GROUP_VERSION, KIND
from prefixtune.api.rules import gpu_notes
from prefixtune.api.validation import validate_spec
from prefixtune.controller.admin import AdminPolicy
from prefixtune.controller.execute import annotated
from prefixtune.controller.observe import Desired, scale_plan
from prefixtune.controller.ownership import name_errors
from prefixtune.controller.render import (
    Owner,
    render_configmap,
    render_deployment,
    render_routed,
    render_service,
    render_service_monitor,
)
from prefixtune.engines.base import ArgsError
from prefixtune.routing.render import settings_for

UID_PLACEHOLDER = "<uid of the ServingDeployment: set by the API server>"


def is_serving_deployment(doc: object) -> bool:
    """Whether ``doc`` claims to be of this API group (then it must be a valid ServingDeployment);
    documents of other kinds in the same file (a Namespace, a Secret) are not rendered."""
    if not isinstance(doc, Mapping):
        return False
    return str(doc.get("apiVersion") or "").partition("/")[0] == API_GROUP


def render_objects(
    doc: object, admin: AdminPolicy | None = None, *, monitoring: bool = False
) -> tuple[list[dict[str, Any]], list[str]]:
    """The children the operator would create for ``doc``, or why it would refuse it ("path:
    message", the operator's own wording). ``admin``: the operator's policy to check the spec
    against (None: not checked, it is the cluster's); ``monitoring``: also the ServiceMonitor.
    An object that is not of this API group yields neither (see ``is_serving_deployment``)."""
    if not isinstance(doc, Mapping):
        return [], [f"the document must be an object (a mapping), got {type(doc).__name__}"]
    if not is_serving_deployment(doc):
        return [], []
    problems: list[str] = []
    if doc.get("apiVersion") != GROUP_VERSION:
        problems.append(f"apiVersion: {doc.get('apiVersion')!r} is not served; allowed: {GROUP_VERSION}")
    if doc.get("kind") != KIND:
        problems.append(f"kind: {doc.get('kind')!r} is not a kind of {GROUP_VERSION}; allowed: {KIND}")
    meta = doc.get("metadata")
    meta = meta if isinstance(meta, Mapping) else {}
    name = meta.get("name")
    if not isinstance(name, str) or not name:
        problems.append("metadata.name: required field is missing; allowed: an RFC 1035 label")
    else:
        problems += name_errors(name)
    spec, errors = validate_spec(doc.get("spec"))
    problems += [str(e) for e in errors]
    if spec is not None and admin is not None:
        problems += admin.spec_problems(spec)
    if spec is None or problems:
        return [], problems
    if admin is not None:
        spec = admin.admitted(spec)
    assert isinstance(name, str)
    annotations = meta.get("annotations")
    owner = Owner(
        namespace=str(meta.get("namespace") or "default"),
        name=name,
        uid=str(meta.get("uid") or UID_PLACEHOLDER),
        annotations=dict(annotations) if isinstance(annotations, Mapping) else {},
    )
    config = spec.knob_config()
    scale = scale_plan(spec, Desired(baseline=config), [], canary_exists=False)
    try:
        configmap = render_configmap(owner, spec, config, "baseline")
        objects = [] if configmap is None else [configmap]
        if spec.adopt is None:  # adopted: the existing Deployment, patched in place (not known here)
            objects.append(render_deployment(owner, spec, config, "baseline", scale.baseline))
    except ArgsError as err:  # validation runs the adapter's checks; this is the last word
        return [], [f"spec: the {spec.engine} adapter cannot render it: {err}"]
    settings = settings_for(spec, config)
    if settings.routed:  # the router's objects; its Service selects the engines until it is ready
        objects += render_routed(owner, spec, settings, router_ready=False, monitoring=monitoring)
    else:
        objects.append(render_service(owner, spec))
    if monitoring:
        objects.append(render_service_monitor(owner, spec))
    return [annotated(body)[0] for body in objects], []


def render_notes(doc: object) -> list[str]:
    """What the operator would note of a valid ``doc`` beside its objects (a GPU the twin does not
    model, ``rules.gpu_notes``); empty for an invalid one (its problems say why)."""
    if not is_serving_deployment(doc) or not isinstance(doc, Mapping):
        return []
    spec, errors = validate_spec(doc.get("spec"))
    return [] if spec is None or errors else gpu_notes(spec)
