"""Which objects the operator may touch: only those controlled by the ServingDeployment's uid.

The Kubernetes controllers' rule (sample-controller's ``metav1.IsControlledBy`` check, the
``ControllerRefManager``): an object is ours when its controller ownerReference carries our uid. An
orphan (no controller reference) is adopted only when it carries our own markers (managed-by
prefixtune and this resource's label), as ``ControllerRefManager`` adopts only orphans that match
its selector. Anything else (a Service ``payments`` someone created by hand, another resource's
Deployment) is foreign: the operator neither patches nor deletes it, and says so (``ResourceExists``).

Pure functions over plain dicts; ``execute.py`` calls them before every write.
"""

from __future__ import annotations

import enum
import re
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

from prefixtune.controller.render import (
    LABEL_MANAGED_BY,
    LABEL_RESOURCE,
    MANAGER,
    Owner,
)
from prefixtune.routing.render import ENGINES_SUFFIX, ROUTER_SUFFIX

CANARY_SUFFIX = "-canary"
# Name suffixes of another resource's children: a resource named ``<x><suffix>`` would fight resource
# ``x`` over them (its engine Deployment, Service, ConfigMap take its own name), so it is refused.
RESERVED_SUFFIXES: dict[str, str] = {
    CANARY_SUFFIX: "the canary Deployment",
    ROUTER_SUFFIX: "the router's Deployment, ServiceAccount, Role and RoleBinding",
    ENGINES_SUFFIX: "the engine pods' own Service (behind a router)",
}
# A Service name (the resource's own name) must be an RFC 1035 label; the name is also a label value.
DNS_1035_LABEL = re.compile(r"^[a-z]([-a-z0-9]*[a-z0-9])?$")
MAX_NAME = 63


class Claim(enum.Enum):
    """The operator's relation to an existing object of the name it wants."""

    OURS = "ours"  # controlled by this resource's uid
    ORPHAN = "orphan"  # no controller, carries our markers: adopt it
    FOREIGN = "foreign"  # anyone else's: hands off


@dataclass(frozen=True)
class Foreign:
    """An object the operator wanted to write but does not control."""

    kind: str
    namespace: str
    name: str
    controller: str  # who controls it ("no controller" for a plain object)

    def message(self) -> str:
        return (
            f"{self.kind} {self.namespace}/{self.name} exists and is not controlled by this "
            f"ServingDeployment ({self.controller}); nothing was changed. Delete or rename it, or "
            "rename this resource"
        )


def controller_of(obj: Mapping[str, Any]) -> Mapping[str, Any] | None:
    refs = (obj.get("metadata") or {}).get("ownerReferences") or []
    return next((r for r in refs if isinstance(r, Mapping) and r.get("controller") is True), None)


def claim(obj: Mapping[str, Any], owner: Owner) -> Claim:
    ref = controller_of(obj)
    if ref is not None:
        return Claim.OURS if owner.uid and str(ref.get("uid") or "") == owner.uid else Claim.FOREIGN
    labels = (obj.get("metadata") or {}).get("labels") or {}
    if labels.get(LABEL_MANAGED_BY) == MANAGER and labels.get(LABEL_RESOURCE) == owner.name:
        return Claim.ORPHAN
    return Claim.FOREIGN


def describe_controller(obj: Mapping[str, Any]) -> str:
    ref = controller_of(obj)
    if ref is None:
        return "no controller"
    return f"controlled by {ref.get('kind', '?')} {ref.get('name', '?')}"


def foreign(obj: Mapping[str, Any], kind: str, owner: Owner) -> Foreign:
    meta = obj.get("metadata") or {}
    return Foreign(kind, owner.namespace, str(meta.get("name", "")), describe_controller(obj))


def name_errors(name: str) -> list[str]:
    """Why a ServingDeployment name cannot be served (empty: it can).

    The name becomes a Service name (an RFC 1035 label: lower case, starts with a letter, at most
    63 characters) and a label value; a name ending in ``-canary`` would be another resource's
    canary Deployment (``llama`` and ``llama-canary`` would fight over one object), so it is refused,
    as are ``-router`` (the router's objects) and ``-engines`` (the engines' Service): ``RESERVED_SUFFIXES``.
    """
    errors: list[str] = []
    if len(name) > MAX_NAME:
        errors.append(
            f"metadata.name: {len(name)} characters; at most {MAX_NAME} (it names the Service, an "
            "RFC 1035 label)"
        )
    if not DNS_1035_LABEL.match(name):
        errors.append(
            f"metadata.name: {name!r} is not an RFC 1035 label (lower-case letters, digits and '-', "
            "starting with a letter, ending with a letter or digit): it names the Service"
        )
    for suffix, what in RESERVED_SUFFIXES.items():
        if name.endswith(suffix):
            errors.append(
                f"metadata.name: {name!r} ends in {suffix!r}, the name of {what} of a resource "
                f"{name[: -len(suffix)]!r}; choose a name that does not"
            )
    return errors
