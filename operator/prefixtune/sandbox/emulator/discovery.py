"""Discovery: /api/v1, /apis, /apis/<group>[/<version>] as the real server lists them."""

from __future__ import annotations

import re
from typing import Any

import attrs
import kmock
from kmock._internal import rendering

from prefixtune.sandbox.emulator.core import ALL_VERBS, EmulatorCore, api_version
from prefixtune.sandbox.emulator.errors import api_error

_VERSION = re.compile(r"^v(\d+)(?:(alpha|beta)(\d+))?$")


def _version_priority(version: str) -> tuple[int, int, int]:
    """Kubernetes version priority: GA before beta before alpha, then higher numbers first."""
    match = _VERSION.match(version)
    if match is None:
        return (-1, 0, 0)
    stability = {None: 3, "beta": 2, "alpha": 1}[match[2]]
    return (stability, int(match[1]), int(match[3] or 0))


@attrs.define(kw_only=True, slots=False)
class Discovery(EmulatorCore):
    """The discovery documents, from the declared and registered resources."""

    async def _serve_version(self, request: rendering.Request) -> rendering.Payload:
        assert request.resource is not None
        wanted = request.resource
        resources = sorted(
            (res for res in self._get_resources() if wanted.check(res) and res.plural),
            key=lambda res: str(res.plural),
        )
        if not resources and wanted.group != "":
            raise api_error(404, f"the server could not find the requested resource ({api_version(wanted)})")
        entries: list[dict[str, Any]] = []
        for res in resources:
            info = self.resources[res] if res in self.resources else kmock.ResourceInfo()
            kind = info.kind or str(res.plural).capitalize()
            entries.append(
                {
                    "name": res.plural,
                    "singularName": info.singular or kind.lower(),
                    "namespaced": bool(info.namespaced),
                    "kind": kind,
                    "verbs": sorted(info.verbs or ALL_VERBS),
                    **({"shortNames": sorted(info.shortnames)} if info.shortnames else {}),
                    **({"categories": sorted(info.categories)} if info.categories else {}),
                }
            )
            for sub in sorted(info.subresources):
                scale = sub == "scale"
                entries.append(
                    {
                        "name": f"{res.plural}/{sub}",
                        "singularName": "",
                        "namespaced": bool(info.namespaced),
                        "kind": "Scale" if scale else kind,
                        **({"group": "autoscaling", "version": "v1"} if scale else {}),
                        "verbs": ["get", "patch", "update"],
                    }
                )
        return {
            "apiVersion": "v1",
            "kind": "APIResourceList",
            "groupVersion": api_version(wanted),
            "resources": entries,
        }

    def _group_entry(self, group: str) -> dict[str, Any] | None:
        versions = sorted(
            {str(r.version) for r in self._get_resources() if r.group == group and r.version},
            key=_version_priority,
            reverse=True,
        )
        if not versions:
            return None
        listed = [{"groupVersion": f"{group}/{v}", "version": v} for v in versions]
        return {"name": group, "versions": listed, "preferredVersion": listed[0]}

    async def _serve_apis(self, request: rendering.Request) -> rendering.Payload:
        groups = sorted({str(r.group) for r in self._get_resources() if r.group})
        entries = [entry for group in groups if (entry := self._group_entry(group)) is not None]
        return {"apiVersion": "v1", "kind": "APIGroupList", "groups": entries}

    async def _serve_group(self, request: rendering.Request) -> rendering.Payload:
        assert request.resource is not None
        entry = self._group_entry(str(request.resource.group))
        if entry is None:
            raise api_error(
                404, f"the server could not find the requested resource (group {request.resource.group})"
            )
        return {"apiVersion": "v1", "kind": "APIGroup", **entry}
