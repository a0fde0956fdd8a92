"""CustomResourceDefinitions: names validated, served versions registered in discovery, conditions set."""

from __future__ import annotations

import copy
from collections.abc import Iterable, Mapping
from typing import Any

import attrs
import kmock

from prefixtune.sandbox.emulator.core import ALL_VERBS, EmulatorCore, _meta, _now, builtin_groups
from prefixtune.sandbox.emulator.errors import api_error
from prefixtune.sandbox.emulator.openapi import ServedResource, strict_decoding_message, unknown_fields
from prefixtune.sandbox.emulator.printers import BUILTIN_PRINTERS, DEFAULT_PRINTER, Printer, crd_printer
from prefixtune.sandbox.emulator.scale import ScalePaths

CRD_RESOURCE = kmock.resource("apiextensions.k8s.io", "v1", "customresourcedefinitions")


@attrs.define(kw_only=True, slots=False)
class CustomResources(EmulatorCore):
    """Custom resources, declared directly (``declare``) or from a stored CRD (``register_crd``)."""

    _custom: dict[str, set[kmock.resource]] = attrs.field(factory=dict, init=False)  # CRD name -> served
    _printers: dict[kmock.resource, Printer] = attrs.field(factory=dict, init=False)  # Table columns
    _schemas: dict[kmock.resource, dict[str, Any]] = attrs.field(factory=dict, init=False)  # openAPIV3Schema

    def declare(
        self,
        resource: str,
        *,
        kind: str,
        namespaced: bool = True,
        status: bool = True,
        shortnames: Iterable[str] = (),
    ) -> kmock.resource:
        """Declare a custom resource: ``declare('example.dev/v1/widgets', kind='Widget')``."""
        res = kmock.resource(resource)
        if not res.group or not res.version or not res.plural:
            raise ValueError(f"resource: need 'group/version/plural', got {resource!r}")
        self.resources[res] = kmock.ResourceInfo(
            kind=kind,
            singular=kind.lower(),
            namespaced=namespaced,
            verbs=ALL_VERBS,
            shortnames=shortnames,
            subresources={"status"} if status else set(),
        )
        self._custom.setdefault(f"{res.plural}.{res.group}", set()).add(res)
        self._printers[res] = crd_printer(())
        return res

    def register_crd(self, crd: Mapping[str, Any]) -> list[kmock.resource]:
        """Register a CRD's served versions in discovery (without storing the CRD object)."""
        spec, names = self._crd_parts(crd)
        crd_name = f"{names['plural']}.{spec['group']}"
        served: set[kmock.resource] = set()
        for version in spec["versions"]:
            if not version.get("served", True):
                continue
            res = kmock.resource(spec["group"], version["name"], names["plural"])
            declared = version.get("subresources") or {}
            subresources = set(declared) & {"status", "scale"}
            if "scale" in subresources:
                self._scales[res] = ScalePaths.from_crd(declared["scale"] or {})
            else:
                self._scales.pop(res, None)
            self.resources[res] = kmock.ResourceInfo(
                kind=names["kind"],
                singular=names.get("singular") or names["kind"].lower(),
                namespaced=spec.get("scope", "Namespaced") == "Namespaced",
                verbs=ALL_VERBS,
                shortnames=names.get("shortNames") or (),
                categories=names.get("categories") or (),
                subresources=subresources,
            )
            self._printers[res] = crd_printer(version.get("additionalPrinterColumns") or ())
            schema = (version.get("schema") or {}).get("openAPIV3Schema")
            if isinstance(schema, dict):
                self._schemas[res] = copy.deepcopy(schema)
            else:
                self._schemas.pop(res, None)
            served.add(res)
        for gone in self._custom.get(crd_name, set()) - served:
            del self.resources[gone]
            self._scales.pop(gone, None)
            self._printers.pop(gone, None)
            self._schemas.pop(gone, None)
        self._custom[crd_name] = served
        return sorted(served, key=lambda r: (str(r.group), str(r.version)))

    def printer(self, res: kmock.resource) -> Printer:
        """The Table printer of a resource: its CRD's printer columns, a built-in printer, or NAME AGE."""
        if res in self._printers:
            return self._printers[res]
        return BUILTIN_PRINTERS.get((str(res.group), str(res.plural)), DEFAULT_PRINTER)

    def served_resources(self) -> list[ServedResource]:
        """Every served resource with its kind, scope and (for a CRD version) its schema."""
        served = []
        for res in self._get_resources():
            if not res.plural or "/" in str(res.plural) or not res.version:
                continue
            info = self.resources[res] if res in self.resources else kmock.ResourceInfo()
            served.append(
                ServedResource(
                    group=str(res.group or ""),
                    version=str(res.version),
                    plural=str(res.plural),
                    kind=info.kind or str(res.plural).capitalize(),
                    namespaced=bool(info.namespaced),
                    schema=self._schemas.get(res),
                )
            )
        return served

    def strict_check(self, res: kmock.resource, obj: Mapping[str, Any], field_validation: str | None) -> None:
        """``?fieldValidation=Strict``: a custom resource's fields its schema does not declare are a 400."""
        schema = self._schemas.get(res)
        if field_validation != "Strict" or schema is None:
            return
        fields = unknown_fields(obj, schema)
        if fields:
            raise api_error(400, strict_decoding_message(fields))

    def _is_custom(self, res: kmock.resource) -> bool:
        return (
            any(res in served for served in self._custom.values()) or str(res.group) not in builtin_groups()
        )

    @staticmethod
    def _crd_parts(crd: Mapping[str, Any]) -> tuple[dict[str, Any], dict[str, Any]]:
        spec = crd.get("spec")
        if not isinstance(spec, dict):
            raise api_error(422, "spec: Required value")
        names = spec.get("names")
        if not isinstance(names, dict) or not names.get("plural") or not names.get("kind"):
            raise api_error(422, "spec.names.plural, spec.names.kind: Required value")
        if not spec.get("group"):
            raise api_error(422, "spec.group: Required value")
        if spec.get("scope", "Namespaced") not in ("Namespaced", "Cluster"):
            raise api_error(
                422, f"spec.scope: Unsupported value {spec.get('scope')!r} (allowed: Namespaced, Cluster)"
            )
        versions = spec.get("versions")
        if not isinstance(versions, list) or not versions or not all(v.get("name") for v in versions):
            raise api_error(422, "spec.versions: Required value: at least one version with a name")
        for version in versions:
            scale = (version.get("subresources") or {}).get("scale")
            if scale is not None:
                ScalePaths.from_crd(scale if isinstance(scale, Mapping) else {})  # 422 when invalid
        return spec, names

    def _crd_status(self, crd: Mapping[str, Any]) -> dict[str, Any]:
        spec, names = self._crd_parts(crd)
        expected = f"{names['plural']}.{spec['group']}"
        if _meta(crd).get("name") != expected:
            raise api_error(
                422, f"metadata.name: Invalid value: {_meta(crd).get('name')!r}: must be {expected!r}"
            )
        accepted = {
            "plural": names["plural"],
            "singular": names.get("singular") or names["kind"].lower(),
            "kind": names["kind"],
            "listKind": names.get("listKind") or f"{names['kind']}List",
            **({"shortNames": names["shortNames"]} if names.get("shortNames") else {}),
            **({"categories": names["categories"]} if names.get("categories") else {}),
        }
        previous = crd.get("status") or {}
        stamp = {c.get("type"): c.get("lastTransitionTime") for c in previous.get("conditions") or []}
        conditions = [
            {
                "type": kind,
                "status": "True",
                "reason": reason,
                "message": message,
                "lastTransitionTime": stamp.get(kind) or _now(),
            }
            for kind, reason, message in (
                ("NamesAccepted", "NoConflicts", "no conflicts found"),
                ("Established", "InitialNamesAccepted", "the initial names have been accepted"),
            )
        ]
        stored = [v["name"] for v in spec["versions"] if v.get("storage")]
        return {"conditions": conditions, "acceptedNames": accepted, "storedVersions": stored}

    async def _drop_crd(self, crd: Mapping[str, Any]) -> None:
        name = str(_meta(crd).get("name"))
        for res in self._custom.pop(name, set()):
            self._printers.pop(res, None)
            self._schemas.pop(res, None)
            if res in self.resources:
                del self.resources[res]
            self._scales.pop(res, None)
            for key, stored in list(self._objects.items()):
                if key[0] == res and not stored.deleted:
                    final = copy.deepcopy(stored.raw)
                    final["metadata"]["resourceVersion"] = str(self._next_rv())
                    await self._remove(res, key, final)
