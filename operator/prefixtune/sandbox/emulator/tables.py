"""Table responses: what ``kubectl get`` asks for, and the Table kube-apiserver answers (pure).

kubectl's human-readable ``get`` sends ``Accept: application/json;as=Table;v=v1;g=meta.k8s.io,
application/json;as=Table;v=v1beta1;g=meta.k8s.io,application/json`` (kubernetes/kubectl
``pkg/cmd/get/get.go``, ``transformRequests``) and prints the ``meta.k8s.io/v1`` ``Table`` it gets
back: the column definitions (priority 0 always, the others with ``-o wide``) and one row of cells
per object. A server that answers plain JSON gets kubectl's client-side fallback: NAME and AGE only.
The columns and cells come from ``printers.py``.

Rows carry the object as ``includeObject`` asks: ``Metadata`` (the default) a
``PartialObjectMetadata``, ``Object`` the whole object, ``None`` nothing; the table's
``metadata.resourceVersion`` is the list's (apimachinery ``pkg/api/meta/table/table.go``
``MetaToTableRow``; the apiserver's ``transformObject`` for the row objects).

Not emulated: watches never stream Tables (``kubectl get -w`` prints the later events with its
client-side columns).
"""

from __future__ import annotations

import datetime
import enum
from collections.abc import Mapping, Sequence
from typing import Any

from prefixtune.sandbox.emulator.printers import Printer

Obj = Mapping[str, Any]

_META_GROUP = "meta.k8s.io"


class TableVersion(enum.Enum):
    """The ``meta.k8s.io`` versions a Table is served in."""

    V1 = "v1"
    V1BETA1 = "v1beta1"


class IncludeObject(enum.Enum):
    """``?includeObject=``: what each row carries besides its cells."""

    NONE = "None"
    METADATA = "Metadata"
    OBJECT = "Object"


class TableRequestError(ValueError):
    """A Table request the server refuses (an unknown ``includeObject``)."""


def requested_table(accept: str) -> TableVersion | None:
    """The Table version an ``Accept`` header asks for first, or None (then plain JSON is served).

    Media ranges are taken in order, as kube-apiserver's negotiation does for equal quality: the
    first ``application/json;as=Table;g=meta.k8s.io;v=<v1|v1beta1>`` wins; a plain JSON range before
    any Table range means JSON.
    """
    for media_range in accept.split(","):
        media, *params = (part.strip() for part in media_range.split(";"))
        if media not in ("application/json", "application/*", "*/*"):
            continue
        values = dict(p.split("=", 1) for p in params if "=" in p)
        if values.get("as") != "Table":
            return None
        if values.get("g") != _META_GROUP:
            continue
        for version in TableVersion:
            if values.get("v") == version.value:
                return version
    return None


def include_object(value: str | None) -> IncludeObject:
    if value in (None, ""):
        return IncludeObject.METADATA
    for option in IncludeObject:
        if option.value == value:
            return option
    allowed = ", ".join(o.value for o in IncludeObject)
    raise TableRequestError(f"includeObject: Unsupported value {value!r} (allowed: {allowed})")


def _row_object(obj: Obj, version: TableVersion, include: IncludeObject) -> dict[str, Any] | None:
    if include is IncludeObject.NONE:
        return None
    if include is IncludeObject.OBJECT:
        return dict(obj)
    return {
        "kind": "PartialObjectMetadata",
        "apiVersion": f"{_META_GROUP}/{version.value}",
        "metadata": dict(obj.get("metadata") or {}),
    }


def to_table(
    objects: Sequence[Obj],
    printer: Printer,
    *,
    version: TableVersion,
    include: IncludeObject,
    resource_version: str,
    now: datetime.datetime,
) -> dict[str, Any]:
    """The ``Table`` of ``objects`` (one object for a GET, the items of a LIST)."""
    rows = []
    for obj in objects:
        row: dict[str, Any] = {"cells": printer.cells(obj, now)}
        attached = _row_object(obj, version, include)
        if attached is not None:
            row["object"] = attached
        rows.append(row)
    return {
        "kind": "Table",
        "apiVersion": f"{_META_GROUP}/{version.value}",
        "metadata": {"resourceVersion": resource_version},
        "columnDefinitions": [c.definition() for c in printer.columns],
        "rows": rows,
    }
