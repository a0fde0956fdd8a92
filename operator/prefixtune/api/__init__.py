"""The ServingDeployment custom resource (prefixtune.io/v1alpha1): models, validation, CRD.

- ``models``: pydantic models of spec and status (camelCase in YAML/JSON).
- ``validation``: ``validate_spec`` / ``validate_resource`` -> (model | None, [FieldError]).
- ``rules``: engine-specific rules and defaults, from the engine adapters.
- ``crd``: the CustomResourceDefinition (``prefixtune crd``), generated from the models.
"""

from __future__ import annotations

from prefixtune.api.models import (
    ServingDeployment,
    ServingDeploymentSpec,
    ServingDeploymentStatus,
)
from prefixtune.api.validation import (
    FieldError,
    SpecError,
    parse_resource,
    parse_spec,
    validate_resource,
    validate_spec,
)

__all__ = [
    "FieldError",
    "ServingDeployment",
    "ServingDeploymentSpec",
    "ServingDeploymentStatus",
    "SpecError",
    "parse_resource",
    "parse_spec",
    "validate_resource",
    "validate_spec",
]
