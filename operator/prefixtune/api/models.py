"""Pydantic models of the ServingDeployment custom resource (prefixtune.io/v1alpha1).

Field names are snake_case in Python and camelCase in YAML/JSON (both are accepted on input; output
uses camelCase). Numbers and booleans are strict (``"1"`` is not an integer, ``1`` is not a boolean),
as the API server's schema is. Unknown fields are errors, so a typo such as ``blocksize`` is reported.

Engine-specific defaults (image, the four knobs, the rollout strategy) are filled in after validation
from the engine adapter, and engine-specific rules (valid block sizes, flags extraArgs may not set, ...)
are checked by ``prefixtune.api.rules``. ``prefixtune.api.validation.validate_spec`` turns every problem
into a ``FieldError`` with a path such as ``spec.config.blockSize``.
"""

from __future__ import annotations

import re
from collections.abc import Callable
from enum import StrEnum
from typing import TYPE_CHECKING, Annotated, Any, ClassVar, Final, Literal, Self

from pydantic import (
    AfterValidator,
    AwareDatetime,
    BaseModel,
    BeforeValidator,
    ConfigDict,
    Field,
    PlainSerializer,
    StrictBool,
    StrictFloat,
    StrictInt,
    ValidationInfo,
    WithJsonSchema,
    create_model,
    model_validator,
)
from pydantic.alias_generators import to_camel
from pydantic.config import JsonDict

from prefixtune.api import references, rules
from prefixtune.api.durations import (
    DURATION_EXAMPLES,
    DURATION_MAX_LENGTH,
    DURATION_PATTERN,
    DurationError,
    format_duration,
    parse_duration,
)
from prefixtune.api.enums import (
    Bound,
    ConditionStatus,
    ConditionType,
    GpuType,
    HeadroomLimit,
    MetricsSource,
    Objective,
    Phase,
    RolloutStrategy,
    ScoreBasis,
    TrialOutcome,
    TrialRole,
    TuningMode,
)
from prefixtune.api.secret_flags import is_secret_env_name
from prefixtune.engines.base import EngineName, KnobConfig, KnobSpec
from prefixtune.engines.knobs import (
    BALANCE_ABS_THRESHOLD,
    BALANCE_REL_THRESHOLD,
    BY_NAME,
    CACHE_THRESHOLD,
    ENGINE_KNOBS,
    KNOBS,
    ROUTER_DEFAULTS,
    ROUTING_POLICY,
    Knob,
    KnobKind,
)
from prefixtune.routing.policy import AUTO_POLICY, Router, RoutingPolicy
from prefixtune.routing.settings import ENGINE_ROUTER

API_GROUP = "prefixtune.io"
API_VERSION = "v1alpha1"
GROUP_VERSION: Final = "prefixtune.io/v1alpha1"
KIND: Final = "ServingDeployment"
LIST_KIND = "ServingDeploymentList"
PLURAL = "servingdeployments"
SINGULAR = "servingdeployment"
SHORT_NAMES = ("sdep",)
CATEGORIES = ("prefixtune",)
# On a ServingDeployment: approves observe mode's recommendation whose status.recommendation.id it
# names (``prefixtune approve``); acted on once, ignored (with a Warning Event) when stale.
APPROVE_ANNOTATION: Final = f"{API_GROUP}/approve"
APPROVAL_MAX_CHARS: Final = 64

# Read only by the local sandbox: which synthetic workload its load generator sends to this
# deployment. In a real cluster traffic comes from users and the annotation is ignored.
SANDBOX_WORKLOAD_ANNOTATION = "prefixtune.io/sandbox-workload"

MAX_EXTRA_ARGS = 64
MAX_EXTRA_ARG_LENGTH = 1024
# Characters a shell would interpret. Engines are started without a shell, but an argument holding
# one of these is almost always a copy-paste mistake or an injection attempt: refuse it.
SHELL_METACHARACTERS = (";", "|", "&", "`", "$", "(", ")", "<", ">", "\n", "\r")
SHELL_METACHARACTERS_TEXT = "; | & ` $ ( ) < > newline"
EXTRA_ARG_PATTERN = r"^[^;|&`$()<>\n\r]*$"
# C0/C1 control characters too (``\xhh`` is read alike by Python and by the API server's Go regexp);
# invisible format characters are refused by the operator's check (references.model_problem).
MODEL_PATTERN = r"^[^\s\x00-\x1f\x7f-\x9f-][^\s\x00-\x1f\x7f-\x9f]*$"
URL_PATTERN = r"^https?://[^\s/?#]+[^\s]*$"
# A GPU type: a node label value (GPU feature discovery's nvidia.com/gpu.product for a type the twin
# does not model is the type itself).
GPU_TYPE_PATTERN = r"^[A-Za-z0-9]([-A-Za-z0-9_.]*[A-Za-z0-9])?$"


class _Model(BaseModel):
    model_config = ConfigDict(
        extra="forbid",
        alias_generator=to_camel,
        validate_by_name=True,
        validate_by_alias=True,
        serialize_by_alias=True,
        allow_inf_nan=False,
        use_enum_values=False,
    )

    def to_dict(self) -> dict[str, Any]:
        """The JSON/YAML form (camelCase, enums and durations as strings, None fields left out)."""
        return self.model_dump(mode="json", exclude_none=True)


def _section(factory: Any, description: str) -> Any:
    """A nested object that is always present: the API server defaults it to {} so that its own
    field defaults apply, exactly as pydantic's default_factory does here."""
    return Field(default_factory=factory, description=description, json_schema_extra={"default": {}})


def _omittable_schema(extra: JsonDict) -> Callable[[JsonDict], None]:
    def apply(schema: JsonDict) -> None:
        # None means "omitted" (the engine default, or not recorded yet), not a value: the CRD shows
        # the field as optional but not nullable (the API server drops nulls of such fields).
        options = schema.pop("anyOf", None)
        if isinstance(options, list):
            (kept,) = [o for o in options if isinstance(o, dict) and o.get("type") != "null"]
            assert isinstance(kept, dict)
            for key, value in kept.items():
                schema.setdefault(key, value)
        schema.pop("default", None)
        schema.update(extra)

    return apply


def _omittable(description: str | None = None, extra: JsonDict | None = None) -> Any:
    """An optional field whose None means "omitted"."""
    return Field(None, description=description, json_schema_extra=_omittable_schema(extra or {}))


# --- durations -------------------------------------------------------------------------------------


def _check_duration(value: object) -> float:
    return parse_duration(value)


def _positive(seconds: float) -> float:
    if seconds <= 0:
        raise DurationError(f"must be a positive duration such as {DURATION_EXAMPLES}")
    return seconds


_DURATION_SCHEMA: dict[str, Any] = {
    "type": "string",
    "pattern": DURATION_PATTERN,
    "maxLength": DURATION_MAX_LENGTH,
}

# Seconds in Python, a duration string ("1m30s") in YAML/JSON.
Duration = Annotated[
    float,
    BeforeValidator(_check_duration),
    PlainSerializer(format_duration, return_type=str),
    WithJsonSchema(_DURATION_SCHEMA),
]
PositiveDuration = Annotated[
    float,
    BeforeValidator(_check_duration),
    AfterValidator(_positive),
    PlainSerializer(format_duration, return_type=str),
    WithJsonSchema(
        {
            **_DURATION_SCHEMA,
            "x-kubernetes-validations": [
                {"rule": "duration(self) > duration('0s')", "message": "must be a positive duration"}
            ],
        }
    ),
]


# --- spec ------------------------------------------------------------------------------------------


MemoryFraction = Annotated[StrictFloat, Field(gt=0, le=1)]
BlockSize = Annotated[StrictInt, Field(ge=1, le=4096)]
PolicyName = Annotated[str, Field(min_length=1, max_length=64)]


def _check_extra_arg(arg: str) -> str:
    bad = sorted({c for c in SHELL_METACHARACTERS if c in arg}, key=SHELL_METACHARACTERS.index)
    if bad:
        shown = ", ".join("newline" if c in "\n\r" else repr(c) for c in bad)
        raise ValueError(
            f"{arg!r} contains shell metacharacter(s) {shown}; not allowed: {SHELL_METACHARACTERS_TEXT} "
            "(pass one flag or value per list item)"
        )
    return arg


ExtraArg = Annotated[
    str,
    Field(max_length=MAX_EXTRA_ARG_LENGTH),
    AfterValidator(_check_extra_arg),
    WithJsonSchema({"type": "string", "maxLength": MAX_EXTRA_ARG_LENGTH, "pattern": EXTRA_ARG_PATTERN}),
]


def _check_model(name: str) -> str:
    problem = references.model_problem(name)
    if problem:
        raise ValueError(problem)
    return name


def _check_image(image: str) -> str:
    problem = references.image_problem(image)
    if problem:
        raise ValueError(problem)
    return image


# A container image reference (spec.image, spec.routing.image): the reference grammar, checked.
ImageRef = Annotated[
    str,
    Field(min_length=1, max_length=512),
    AfterValidator(_check_image),
    WithJsonSchema({"type": "string", "minLength": 1, "maxLength": 512, "pattern": references.IMAGE_PATTERN}),
]


def _check_url(url: str) -> str:
    if not re.match(URL_PATTERN, url):
        raise ValueError(f"{url!r} is not an http(s) URL; e.g. http://prometheus.monitoring:9090")
    return url


class GpuSpec(_Model):
    """GPUs of one replica."""

    count: StrictInt = Field(1, ge=1, le=8, description="GPUs per replica; becomes the tensor-parallel size.")
    type: Annotated[str, Field(min_length=1, max_length=63, pattern=GPU_TYPE_PATTERN)] = Field(
        GpuType.H100_80GB.value,
        description="GPU model: H100-80GB, H200 or A100-80GB (the twin models these), or any GPU feature "
        "discovery product name (e.g. NVIDIA-L40S, NVIDIA-B200). Selects the node (label "
        "nvidia.com/gpu.product; spec.pod.nodeSelector overrides it) and the twin's model.",
    )


class FloatRange(_Model):
    """An inclusive range [min, max] with min < max."""

    model_config = ConfigDict(
        json_schema_extra={
            "x-kubernetes-validations": [
                {"rule": "self.min < self.max", "message": "min must be less than max"}
            ]
        }
    )

    min: MemoryFraction
    max: MemoryFraction


_SET: JsonDict = {"x-kubernetes-list-type": "set"}  # scalar list without duplicates


# --- the knob models: their fields come from the knob registry (prefixtune.engines.knobs) ---------


class _KnobFields(_Model):
    """A model with one field per registry knob of ``knob_fields`` (added by ``_knob_model``)."""

    knob_fields: ClassVar[tuple[Knob, ...]] = KNOBS

    def knob_values(self) -> dict[str, Any]:
        """{knob name: field value} in registry order (None where a knob is omitted)."""
        return {knob.name: getattr(self, knob.name) for knob in self.knob_fields}

    def to_knob_config(self) -> KnobConfig:
        """The KnobConfig of a filled-in config (every validated spec has one)."""
        values = self.knob_values()
        missing = [name for name, value in values.items() if value is None]
        if missing:
            raise ValueError(
                f"config is not filled in (missing {', '.join(missing)}); validate the spec first"
            )
        return KnobConfig.from_dict(values)

    @classmethod
    def from_knob_config(cls, config: KnobConfig) -> Self:
        values = config.to_dict()
        return cls.model_validate({knob.name: values[knob.name] for knob in cls.knob_fields})


class _ConfigSpec(_KnobFields):
    """The baseline configuration of the tuned knobs. Omitted knobs take the engine's default."""

    # The engines' knobs; the router's (routing policy, thresholds) have their baseline in spec.routing.
    knob_fields: ClassVar[tuple[Knob, ...]] = ENGINE_KNOBS


class _SearchSpaceSpec(_Model):
    """Values the tuner may try. Each omitted knob uses the engine adapter's default space."""

    def listed(self) -> dict[str, Any]:
        """{knob name: its range (FloatRange) or list of values} for each knob the user listed."""
        values = {knob.name: getattr(self, knob.name) for knob in KNOBS}
        return {name: value for name, value in values.items() if value is not None}


class _KnobValues(_KnobFields):
    """A complete configuration of the tuned knobs (every knob set), as recorded in the status."""


# One value of a knob, by its kind (the structural bounds; each engine narrows them).
_VALUE_TYPE: dict[KnobKind, Any] = {
    KnobKind.FRACTION: MemoryFraction,
    KnobKind.INTEGER: BlockSize,
    KnobKind.SWITCH: StrictBool,
    KnobKind.NAME: PolicyName,
    KnobKind.NUMBER: StrictFloat,
}


def _value_type(knob: Knob) -> Any:
    """One value of ``knob``: its kind's type, an integer within the knob's own bounds."""
    if knob.kind is KnobKind.INTEGER and knob.low is not None and knob.high is not None:
        return Annotated[StrictInt, Field(ge=knob.low, le=knob.high)]
    if knob.kind is KnobKind.NUMBER and knob.low is not None and knob.high is not None:
        return Annotated[StrictFloat, Field(ge=knob.low, le=knob.high)]
    return _VALUE_TYPE[knob.kind]


def _space_type(knob: Knob) -> Any:
    """A fraction is searched over a range; any other knob over a list of its values."""
    if knob.continuous:
        return FloatRange
    most = 2 if knob.kind is KnobKind.SWITCH else 16
    values: Any = list.__class_getitem__(_value_type(knob))  # a type built at runtime
    return Annotated[values, Field(min_length=1, max_length=most)]


def _knob_model(base: type[_Model], field: Callable[[Knob], tuple[Any, Any]]) -> Any:
    """``base`` with one field per registry knob, in registry order (names, docs and types from it)."""
    knobs: tuple[Knob, ...] = base.knob_fields if issubclass(base, _KnobFields) else KNOBS
    fields: dict[str, Any] = {knob.name: field(knob) for knob in knobs}
    name = base.__name__.lstrip("_")
    return create_model(name, __base__=base, __module__=__name__, __doc__=base.__doc__, **fields)


if TYPE_CHECKING:  # the static type is the base with the knob methods; fields are read by name
    ConfigSpec = _ConfigSpec
    SearchSpaceSpec = _SearchSpaceSpec
    KnobValues = _KnobValues
else:
    ConfigSpec = _knob_model(
        _ConfigSpec, lambda knob: (_value_type(knob) | None, _omittable(knob.config_doc))
    )
    SearchSpaceSpec = _knob_model(
        _SearchSpaceSpec,
        lambda knob: (
            _space_type(knob) | None,
            _omittable(knob.space_doc, None if knob.continuous else _SET),
        ),
    )
    # A knob with an ``unset`` value defaults to it: configs recorded before the knob existed read.
    KnobValues = _knob_model(
        _KnobValues,
        lambda knob: (_value_type(knob), ... if knob.unset is None else Field(knob.unset)),
    )


class SloSpec(_Model):
    """Latency objectives; goodput counts output tokens of requests that meet both."""

    ttft_p99: PositiveDuration = Field("2s", validate_default=True, description="Time to first token, p99.")
    itl_p99: PositiveDuration = Field("150ms", validate_default=True, description="Inter-token latency, p99.")


class TrialSpec(_Model):
    """One trial: roll out, warm the cache up, then measure."""

    warmup: Duration = Field(
        "3m", validate_default=True, description="Time to warm the cache before measuring."
    )
    measure: PositiveDuration = Field("10m", validate_default=True, description="Measurement window.")
    min_requests: StrictInt = Field(
        300, ge=1, le=1_000_000, description="Requests the window needs before it is scored."
    )


class BudgetSpec(_Model):
    max_trials: StrictInt = Field(
        20, ge=1, le=200, description="Trials per tuning run, the baseline not included."
    )


class RolloutSpec(_Model):
    strategy: RolloutStrategy | None = _omittable(
        "canary (a trial replica beside the baseline; needs replicas >= 2) or rolling. "
        "Default: canary when replicas >= 2, else rolling."
    )
    min_interval: Duration = Field(
        "15m", validate_default=True, description="Least time between two rollouts (no flapping)."
    )
    max_trial_replicas: Annotated[StrictInt, Field(ge=1, le=1000)] | None = _omittable(
        "rolling: the most replicas a trial moves onto the untested config. Below spec.replicas the "
        "trial runs on that many pods beside the others on the stable config and is scored against "
        "them in the same window (a canary of that many pods); the best config is then rolled to "
        "every replica. Default: every replica. A canary trial always moves one."
    )


class DriftSpec(_Model):
    threshold: StrictFloat = Field(
        0.25, gt=0, le=1, description="Relative change of the workload that starts a new tuning run."
    )


class MetricsSpec(_Model):
    source: MetricsSource = Field(
        MetricsSource.SCRAPE,
        description="scrape (the pods' /metrics directly) or prometheus (the operator's Prometheus).",
    )
    url: (
        Annotated[
            str,
            Field(max_length=2048),
            AfterValidator(_check_url),
            WithJsonSchema({"type": "string", "maxLength": 2048, "pattern": URL_PATTERN}),
        ]
        | None
    ) = _omittable(
        "Prometheus base URL; used only when the admin allowed its host (prefixtune run "
        "--prometheus-allowed-hosts), else the operator's own Prometheus (--prometheus-url) is queried."
    )


class TuningSpec(_Model):
    mode: TuningMode = Field(
        TuningMode.AUTO,
        description='"off" (deploy only; quote it in YAML: a bare off is the boolean false), '
        "observe (measure and recommend only) or auto (tune and roll out).",
    )
    paused: StrictBool = Field(
        False,
        description="Pause tuning: a trial in flight is stopped and rolled back (the stable config "
        "keeps running), nothing new starts; false resumes in the same epoch (prefixtune pause|resume).",
    )
    objective: Objective = Field(Objective.GOODPUT, description="What the tuner maximises.")
    slo: SloSpec = _section(SloSpec, "Latency objectives.")
    space: SearchSpaceSpec = _section(SearchSpaceSpec, "Search space; defaults come from the engine adapter.")
    trial: TrialSpec = _section(TrialSpec, "Trial timing.")
    budget: BudgetSpec = _section(BudgetSpec, "Trial budget.")
    rollout: RolloutSpec = _section(RolloutSpec, "How trial configurations are rolled out.")
    drift: DriftSpec = _section(DriftSpec, "When to re-tune.")
    metrics: MetricsSpec = _section(MetricsSpec, "Where signals come from.")
    min_gain: StrictFloat = Field(
        0.02,
        ge=0,
        le=1,
        description="Least gain over the deployed config worth a rollout, as a share of its score "
        "(0.02: 2%). A smaller measured gain, or one the window-to-window noise hides, keeps the "
        "deployed config (no significant gain).",
    )
    confidence: StrictFloat = Field(
        0.95,
        ge=0.5,
        lt=1,
        description="Confidence needed that the gain is at least minGain before the deployed config "
        "is left (0.5..1; 0.5 with minGain 0 takes the best measured config whatever the noise).",
    )


QUANTITY_PATTERN = r"^[0-9]+(\.[0-9]+)?(m|k|M|G|T|P|E|Ki|Mi|Gi|Ti|Pi|Ei)?$"
SECRET_NAME_PATTERN = r"^[a-z0-9]([-a-z0-9]*[a-z0-9])?(\.[a-z0-9]([-a-z0-9]*[a-z0-9])?)*$"
SECRET_KEY_PATTERN = r"^[-._a-zA-Z0-9]+$"
Quantity = Annotated[str, Field(min_length=1, max_length=32, pattern=QUANTITY_PATTERN)]


class SecretKeyRef(_Model):
    """A key of a Secret in the resource's namespace (the kubelet reads it; the operator never does)."""

    name: Annotated[str, Field(min_length=1, max_length=253, pattern=SECRET_NAME_PATTERN)] = Field(
        description="The Secret's name."
    )
    key: Annotated[str, Field(min_length=1, max_length=253, pattern=SECRET_KEY_PATTERN)] = Field(
        "api-key", description="The key in the Secret."
    )


class EngineResources(_Model):
    """CPU and memory requests of each engine pod (defaults are sized from the model and GPUs)."""

    cpu: Quantity | None = _omittable("CPU request, e.g. 8 or 7500m.")
    memory: Quantity | None = _omittable("Memory request, e.g. 64Gi.")
    ephemeral_storage: Quantity | None = _omittable(
        "Ephemeral storage request (the engine's caches on the node's disk), e.g. 100Gi."
    )
    hugepages_2mi: Quantity | None = Field(
        None,
        alias="hugepages2Mi",
        description="2 MiB huge pages (request and limit), for an emptyDir of medium HugePages-2Mi.",
        json_schema_extra=_omittable_schema({}),
    )
    hugepages_1gi: Quantity | None = Field(
        None,
        alias="hugepages1Gi",
        description="1 GiB huge pages (request and limit), for an emptyDir of medium HugePages-1Gi.",
        json_schema_extra=_omittable_schema({}),
    )


# --- pod overrides (spec.pod) ---------------------------------------------------------------------

MAX_POD_ITEMS = 32  # env vars, volumes, mounts, tolerations, ... each
MAX_MAP_ENTRIES = 32  # nodeSelector, labels, annotations
DNS_LABEL_PATTERN = r"^[a-z0-9]([-a-z0-9]*[a-z0-9])?$"
ENV_NAME_PATTERN = r"^[-._a-zA-Z][-._a-zA-Z0-9]*$"
MOUNT_PATH_PATTERN = r"^/[^\x00-\x1f\x7f:]*$"
SUB_PATH_PATTERN = r"^[^/\x00-\x1f\x7f][^\x00-\x1f\x7f]*$"
LABEL_VALUE_PATTERN = r"^(([A-Za-z0-9][-A-Za-z0-9_.]*)?[A-Za-z0-9])?$"
_LABEL_NAME = re.compile(r"^[A-Za-z0-9]([-A-Za-z0-9_.]*[A-Za-z0-9])?$")
_DNS_SUBDOMAIN = re.compile(SECRET_NAME_PATTERN)

DnsLabel = Annotated[str, Field(min_length=1, max_length=63, pattern=DNS_LABEL_PATTERN)]
DnsSubdomain = Annotated[str, Field(min_length=1, max_length=253, pattern=SECRET_NAME_PATTERN)]
ConfigKey = Annotated[str, Field(min_length=1, max_length=253, pattern=SECRET_KEY_PATTERN)]
EnvName = Annotated[str, Field(min_length=1, max_length=256, pattern=ENV_NAME_PATTERN)]


def key_problem(key: str) -> str | None:
    """Why ``key`` is not a Kubernetes label/annotation key (``[prefix/]name``), or None."""
    prefix, slash, name = key.rpartition("/")
    if slash and (not prefix or len(prefix) > 253 or not _DNS_SUBDOMAIN.match(prefix)):
        return f"{key!r}: the prefix before '/' must be a DNS subdomain (e.g. example.com)"
    if not name or len(name) > 63 or not _LABEL_NAME.match(name):
        return (
            f"{key!r}: the name must be 1-63 characters of letters, digits, '-', '_' or '.', "
            "starting and ending with a letter or digit"
        )
    return None


def _map_check(value_max: int, value_pattern: str | None) -> Callable[[dict[str, str]], dict[str, str]]:
    """The check of a map of label/annotation-style keys to bounded strings (the CRD's schema bounds
    the entries and the values; the keys are checked here)."""

    def check(mapping: dict[str, str]) -> dict[str, str]:
        if len(mapping) > MAX_MAP_ENTRIES:
            raise ValueError(f"has {len(mapping)} entries; allowed: at most {MAX_MAP_ENTRIES}")
        for key, value in mapping.items():
            problem = key_problem(key)
            if problem:
                raise ValueError(problem)
            if len(value) > value_max or (value_pattern and not re.match(value_pattern, value)):
                shown = "" if value_pattern is None else " of letters, digits, '-', '_' or '.'"
                raise ValueError(f"{key}: the value must be at most {value_max} characters{shown}")
        return mapping

    return check


def _map_schema(value_max: int, value_pattern: str | None) -> JsonDict:
    value_schema: JsonDict = {"type": "string", "maxLength": value_max}
    if value_pattern is not None:
        value_schema["pattern"] = value_pattern
    return {"type": "object", "additionalProperties": value_schema, "maxProperties": MAX_MAP_ENTRIES}


LabelMap = Annotated[
    dict[str, str],
    AfterValidator(_map_check(63, LABEL_VALUE_PATTERN)),
    WithJsonSchema(_map_schema(63, LABEL_VALUE_PATTERN)),
]
AnnotationMap = Annotated[
    dict[str, str], AfterValidator(_map_check(4096, None)), WithJsonSchema(_map_schema(4096, None))
]


def _one_of(model: BaseModel, fields: tuple[str, ...], what: str) -> None:
    given = [f for f in fields if getattr(model, f) is not None]
    if len(given) != 1:
        names = ", ".join(to_camel(f) for f in fields)
        found = f" (found {', '.join(to_camel(f) for f in given)})" if given else ""
        raise ValueError(f"set exactly one of {names} in {what}{found}")


class KeyRef(_Model):
    """A key of a Secret or ConfigMap in the resource's namespace (the kubelet reads it, never the
    operator)."""

    name: DnsSubdomain = Field(description="The Secret's or ConfigMap's name.")
    key: ConfigKey = Field(description="The key in it.")
    optional: StrictBool | None = _omittable("Start the pod even when the key does not exist.")


class EnvVarSource(_Model):
    """Where a variable's value comes from: a Secret's key or a ConfigMap's key (nothing else)."""

    secret_key_ref: KeyRef | None = _omittable("A key of a Secret.")
    config_map_key_ref: KeyRef | None = _omittable("A key of a ConfigMap.")

    @model_validator(mode="after")
    def _one_source(self) -> Self:
        _one_of(self, ("secret_key_ref", "config_map_key_ref"), "valueFrom")
        return self


class EnvVar(_Model):
    """An environment variable of the engine container: a literal value, or a Secret's or
    ConfigMap's key. A secret (a name ending in TOKEN, KEY, SECRET, PASSWORD, ...) comes from a
    Secret: its value would sit in the spec in plain text."""

    name: EnvName = Field(description="The variable's name.")
    value: Annotated[str, Field(max_length=4096)] | None = _omittable("A literal value (not a secret).")
    value_from: EnvVarSource | None = _omittable("A Secret's or ConfigMap's key.")

    @model_validator(mode="after")
    def _one_value(self) -> Self:
        if self.value is not None and self.value_from is not None:
            raise ValueError("set value or valueFrom, not both")
        if self.value is not None and is_secret_env_name(self.name):
            raise ValueError(
                f"{self.name} looks like a secret: a literal value would sit in plain text in the spec; "
                "use valueFrom.secretKeyRef (a key of a Secret) instead"
            )
        return self


class PvcSource(_Model):
    claim_name: DnsSubdomain = Field(description="A PersistentVolumeClaim in the resource's namespace.")
    read_only: StrictBool | None = _omittable("Mount it read-only.")


class EmptyDirMedium(StrEnum):
    DISK = ""
    MEMORY = "Memory"
    HUGE_PAGES = "HugePages"
    HUGE_PAGES_2MI = "HugePages-2Mi"
    HUGE_PAGES_1GI = "HugePages-1Gi"


class EmptyDirSource(_Model):
    medium: EmptyDirMedium | None = _omittable(
        "\"\" (the node's disk), Memory (tmpfs: counts against the pod's memory) or HugePages[-2Mi|-1Gi] "
        "(needs spec.resources.hugepages2Mi/hugepages1Gi)."
    )
    size_limit: Quantity | None = _omittable("Largest size, e.g. 20Gi.")


class ConfigMapSource(_Model):
    name: DnsSubdomain = Field(description="A ConfigMap in the resource's namespace.")
    optional: StrictBool | None = _omittable("Start the pod even when it does not exist.")


class SecretSource(_Model):
    secret_name: DnsSubdomain = Field(description="A Secret in the resource's namespace.")
    optional: StrictBool | None = _omittable("Start the pod even when it does not exist.")


class HostPathType(StrEnum):
    UNSET = ""
    DIRECTORY = "Directory"
    DIRECTORY_OR_CREATE = "DirectoryOrCreate"
    FILE = "File"
    FILE_OR_CREATE = "FileOrCreate"


class HostPathSource(_Model):
    path: Annotated[str, Field(min_length=1, max_length=1024, pattern=MOUNT_PATH_PATTERN)] = Field(
        description="A path on the node."
    )
    type: HostPathType | None = _omittable("What must exist at the path.")


VOLUME_SOURCES = ("persistent_volume_claim", "empty_dir", "config_map", "secret", "host_path")


class Volume(_Model):
    """A volume of the engine pod: exactly one of persistentVolumeClaim, emptyDir, configMap, secret,
    hostPath (only where the admin allows it)."""

    name: DnsLabel = Field(description="The volume's name (volumeMounts refer to it).")
    persistent_volume_claim: PvcSource | None = _omittable("A PersistentVolumeClaim (a model cache).")
    empty_dir: EmptyDirSource | None = _omittable("Scratch space for the pod's lifetime.")
    config_map: ConfigMapSource | None = _omittable("A ConfigMap's keys as files.")
    secret: SecretSource | None = _omittable("A Secret's keys as files.")
    host_path: HostPathSource | None = _omittable(
        "A node's directory; refused unless the admin allows it (prefixtune run --allow-host-path-volumes)."
    )

    @model_validator(mode="after")
    def _one_source(self) -> Self:
        _one_of(self, VOLUME_SOURCES, "a volume")
        return self


class VolumeMount(_Model):
    """Where a volume of spec.pod.volumes is mounted in the engine container."""

    name: DnsLabel = Field(description="A volume of spec.pod.volumes.")
    mount_path: Annotated[str, Field(min_length=1, max_length=1024, pattern=MOUNT_PATH_PATTERN)] = Field(
        description="An absolute path in the container."
    )
    sub_path: Annotated[str, Field(min_length=1, max_length=1024, pattern=SUB_PATH_PATTERN)] | None = (
        _omittable("A path inside the volume (relative).")
    )
    read_only: StrictBool | None = _omittable("Mount it read-only.")


class TolerationOperator(StrEnum):
    EXISTS = "Exists"
    EQUAL = "Equal"


class TaintEffect(StrEnum):
    NO_SCHEDULE = "NoSchedule"
    PREFER_NO_SCHEDULE = "PreferNoSchedule"
    NO_EXECUTE = "NoExecute"


class Toleration(_Model):
    key: Annotated[str, Field(max_length=317)] | None = _omittable("The taint's key (none: every taint).")
    operator: TolerationOperator | None = _omittable("Equal (the default) or Exists.")
    value: Annotated[str, Field(max_length=63, pattern=LABEL_VALUE_PATTERN)] | None = _omittable()
    effect: TaintEffect | None = _omittable("The taint's effect (none: every effect).")
    toleration_seconds: Annotated[StrictInt, Field(ge=0)] | None = _omittable("NoExecute: how long.")

    @model_validator(mode="after")
    def _as_kubernetes_checks(self) -> Self:
        # The API server's own rules for a toleration (it would refuse the Deployment otherwise).
        exists = self.operator is TolerationOperator.EXISTS
        if exists and self.value:
            raise ValueError("value must be empty with operator Exists")
        if not self.key and not exists:
            raise ValueError("a toleration without a key (of every taint) needs operator Exists")
        if self.toleration_seconds is not None and self.effect is not TaintEffect.NO_EXECUTE:
            raise ValueError("tolerationSeconds is only for effect NoExecute")
        return self


class NodeSelectorOperator(StrEnum):
    IN = "In"
    NOT_IN = "NotIn"
    EXISTS = "Exists"
    DOES_NOT_EXIST = "DoesNotExist"
    GT = "Gt"
    LT = "Lt"


class LabelSelectorOperator(StrEnum):
    IN = "In"
    NOT_IN = "NotIn"
    EXISTS = "Exists"
    DOES_NOT_EXIST = "DoesNotExist"


LabelValues = Annotated[list[Annotated[str, Field(max_length=63)]], Field(max_length=MAX_POD_ITEMS)]


def _check_values(operator: NodeSelectorOperator, values: list[str] | None) -> None:
    """The API server's rule for a selector requirement's values (it would refuse the Deployment)."""
    count = len(values or [])
    if operator in (NodeSelectorOperator.IN, NodeSelectorOperator.NOT_IN) and count == 0:
        raise ValueError(f"operator {operator} needs at least one value")
    if operator in (NodeSelectorOperator.EXISTS, NodeSelectorOperator.DOES_NOT_EXIST) and count:
        raise ValueError(f"operator {operator} takes no values")
    if operator in (NodeSelectorOperator.GT, NodeSelectorOperator.LT) and (
        count != 1 or not re.match(r"^-?[0-9]+$", (values or [""])[0])
    ):
        raise ValueError(f"operator {operator} takes exactly one integer value")


class NodeSelectorRequirement(_Model):
    key: Annotated[str, Field(min_length=1, max_length=317)]
    operator: NodeSelectorOperator
    values: LabelValues | None = _omittable()

    @model_validator(mode="after")
    def _values_fit(self) -> Self:
        _check_values(NodeSelectorOperator(self.operator.value), self.values)
        return self


class NodeSelectorTerm(_Model):
    match_expressions: Annotated[list[NodeSelectorRequirement], Field(max_length=MAX_POD_ITEMS)] | None = (
        _omittable()
    )
    match_fields: Annotated[list[NodeSelectorRequirement], Field(max_length=MAX_POD_ITEMS)] | None = (
        _omittable()
    )


class NodeSelector(_Model):
    node_selector_terms: Annotated[list[NodeSelectorTerm], Field(min_length=1, max_length=MAX_POD_ITEMS)]


Weight = Annotated[StrictInt, Field(ge=1, le=100)]


class PreferredSchedulingTerm(_Model):
    weight: Weight
    preference: NodeSelectorTerm


class NodeAffinity(_Model):
    required_during_scheduling_ignored_during_execution: NodeSelector | None = _omittable()
    preferred_during_scheduling_ignored_during_execution: (
        Annotated[list[PreferredSchedulingTerm], Field(max_length=MAX_POD_ITEMS)] | None
    ) = _omittable()


class LabelSelectorRequirement(_Model):
    key: Annotated[str, Field(min_length=1, max_length=317)]
    operator: LabelSelectorOperator
    values: LabelValues | None = _omittable()

    @model_validator(mode="after")
    def _values_fit(self) -> Self:
        _check_values(NodeSelectorOperator(self.operator.value), self.values)
        return self


class LabelSelector(_Model):
    match_labels: LabelMap | None = _omittable()
    match_expressions: Annotated[list[LabelSelectorRequirement], Field(max_length=MAX_POD_ITEMS)] | None = (
        _omittable()
    )


class PodAffinityTerm(_Model):
    label_selector: LabelSelector | None = _omittable()
    namespaces: Annotated[list[DnsLabel], Field(max_length=MAX_POD_ITEMS)] | None = _omittable()
    namespace_selector: LabelSelector | None = _omittable()
    topology_key: Annotated[str, Field(min_length=1, max_length=317)]


class WeightedPodAffinityTerm(_Model):
    weight: Weight
    pod_affinity_term: PodAffinityTerm


class PodAffinity(_Model):
    required_during_scheduling_ignored_during_execution: (
        Annotated[list[PodAffinityTerm], Field(max_length=MAX_POD_ITEMS)] | None
    ) = _omittable()
    preferred_during_scheduling_ignored_during_execution: (
        Annotated[list[WeightedPodAffinityTerm], Field(max_length=MAX_POD_ITEMS)] | None
    ) = _omittable()


class Affinity(_Model):
    """The pod's affinity, as a Pod's spec.affinity."""

    node_affinity: NodeAffinity | None = _omittable()
    pod_affinity: PodAffinity | None = _omittable()
    pod_anti_affinity: PodAffinity | None = _omittable()


class LocalObjectReference(_Model):
    name: DnsSubdomain = Field(description="A Secret of type kubernetes.io/dockerconfigjson.")


def _check_priority_class(name: str) -> str:
    if name.startswith("system-"):
        raise ValueError(
            f"{name!r}: the system- priority classes are Kubernetes' own (node- and cluster-critical "
            "pods); use one the cluster admin created for workloads"
        )
    return name


class PodOverrides(_Model):
    """What a cluster needs of the engine pod besides what the operator renders: environment,
    volumes, scheduling and pull secrets. Merged under the operator's own fields: a name the
    operator sets (its env vars, volumes, mounts, labels) is refused, never overwritten. Secrets only
    by reference (the kubelet reads them; the operator never does)."""

    env: Annotated[list[EnvVar], Field(max_length=MAX_POD_ITEMS)] = Field(
        default_factory=list,
        description="Environment variables of the engine container (value, or valueFrom.secretKeyRef / "
        "configMapKeyRef).",
    )
    volumes: Annotated[list[Volume], Field(max_length=MAX_POD_ITEMS)] = Field(
        default_factory=list, description="Volumes of the pod (mounted by volumeMounts)."
    )
    volume_mounts: Annotated[list[VolumeMount], Field(max_length=MAX_POD_ITEMS)] = Field(
        default_factory=list, description="Mounts of spec.pod.volumes in the engine container."
    )
    node_selector: LabelMap | None = _omittable(
        "Node labels the pod requires, merged over the operator's (nvidia.com/gpu.product from "
        "spec.gpu.type; set that key here to override it)."
    )
    tolerations: Annotated[list[Toleration], Field(max_length=MAX_POD_ITEMS)] = Field(
        default_factory=list, description="Tolerations, added to the operator's (nvidia.com/gpu)."
    )
    affinity: Affinity | None = _omittable("Node and pod (anti-)affinity.")
    image_pull_secrets: Annotated[list[LocalObjectReference], Field(max_length=8)] = Field(
        default_factory=list, description="Secrets for pulling the image from a private registry."
    )
    priority_class_name: (
        Annotated[
            str,
            Field(min_length=1, max_length=253, pattern=SECRET_NAME_PATTERN),
            AfterValidator(_check_priority_class),
        ]
        | None
    ) = _omittable("The pods' PriorityClass (not a system- one).")
    labels: LabelMap | None = _omittable("Labels of the pods (not the operator's own keys).")
    annotations: AnnotationMap | None = _omittable("Annotations of the pods (not the operator's own keys).")


DEPLOYMENT_NAME_PATTERN = SECRET_NAME_PATTERN  # an RFC 1123 subdomain, as every object name


class AdoptSpec(_Model):
    """An existing engine Deployment of the resource's namespace to tune in place (it must opt in)."""

    deployment: Annotated[str, Field(min_length=1, max_length=253, pattern=DEPLOYMENT_NAME_PATTERN)] = Field(
        description="The Deployment's name, in the resource's namespace. It is adopted only when it "
        "carries the annotation prefixtune.io/adopt naming this resource; its engine container's "
        "command is the starting config (spec.config, extraArgs and image are then omitted)."
    )


# --- routing (replicas >= 2): the router in front of the engines --------------------------------

_ROUTING_POLICIES: tuple[str, ...] = (AUTO_POLICY, *(p.value for p in RoutingPolicy))


def _check_routing_policy(value: str) -> str:
    if value not in _ROUTING_POLICIES:
        raise ValueError(f"unknown routing policy {value!r}; allowed: {', '.join(_ROUTING_POLICIES)}")
    return value


def _bounded(knob: str) -> Any:
    """A routing knob's value type, with the registry's bounds (``prefixtune.engines.knobs``)."""
    return _value_type(BY_NAME[knob])


class RoutingSpec(_Model):
    """The router in front of the engine pods (replicas >= 2), and its settings.

    The policy and the three thresholds are the baseline of the routing knobs: a trial may change
    them, restarting only the router (spec.tuning.space.routingPolicy etc. put them in the search).
    """

    policy: Annotated[
        str,
        AfterValidator(_check_routing_policy),
        WithJsonSchema({"type": "string", "enum": list(_ROUTING_POLICIES)}),
    ] = Field(
        AUTO_POLICY,
        description="kube-proxy (no router: the Service spreads connections over the pods), a policy of "
        "the router (random, round_robin, power_of_two, cache_aware; vllm-router also consistent_hash), "
        "or auto: cache_aware when spec.replicas >= 2 and prefix caching is on (the engines reuse shared "
        "prefixes, so sending a prefix back to the pod that cached it pays), else kube-proxy.",
    )
    router: Router | None = _omittable(
        f"{' or '.join(r.value for r in Router)}. Default by engine: "
        + ", ".join(f"{engine.value} -> {router.value}" for engine, router in ENGINE_ROUTER.items())
        + ". sglang-router's cache_aware matches the request text; vllm-router's matches token ids it "
        "asks the engines for (vLLM's render endpoint; without them it routes by load alone)."
    )
    image: ImageRef | None = _omittable(
        "The router's container image (it runs the router's wheel); default by router."
    )
    replicas: StrictInt = Field(1, ge=1, le=100, description="Router replicas.")
    cache_threshold: _bounded(CACHE_THRESHOLD) = Field(  # type: ignore[valid-type]
        ROUTER_DEFAULTS.cache_threshold, description=BY_NAME[CACHE_THRESHOLD].config_doc
    )
    balance_abs_threshold: _bounded(BALANCE_ABS_THRESHOLD) = Field(  # type: ignore[valid-type]
        ROUTER_DEFAULTS.balance_abs_threshold, description=BY_NAME[BALANCE_ABS_THRESHOLD].config_doc
    )
    balance_rel_threshold: _bounded(BALANCE_REL_THRESHOLD) = Field(  # type: ignore[valid-type]
        ROUTER_DEFAULTS.balance_rel_threshold, description=BY_NAME[BALANCE_REL_THRESHOLD].config_doc
    )
    max_tree_size: Annotated[StrictInt, Field(ge=1, le=1 << 40)] | None = _omittable(
        "cache_aware: the router's approximate radix tree, in characters per worker. Default: the "
        "engines' KV pool in characters (its tokens as the engine reports them x 4 characters a token, "
        "at most the router's own default) once a pod has reported it, so that the router does not "
        "remember prefixes the engines have evicted; before that, the router's own default."
    )

    def knob_values(self) -> dict[str, object]:
        """The routing knobs' baseline, by knob name (``ROUTER_KNOBS``)."""
        return {
            ROUTING_POLICY: self.policy,
            CACHE_THRESHOLD: self.cache_threshold,
            BALANCE_ABS_THRESHOLD: self.balance_abs_threshold,
            BALANCE_REL_THRESHOLD: self.balance_rel_threshold,
        }

    @classmethod
    def field_of(cls, knob: str) -> str:
        """The camelCase field of spec.routing that holds a routing knob's baseline."""
        return "policy" if knob == ROUTING_POLICY else to_camel(knob)


class ServingDeploymentSpec(_Model):
    """A GPU serving deployment of one model on one engine, and how to tune it."""

    engine: EngineName = Field(description="Serving engine: vllm, sglang or trtllm.")
    model: Annotated[
        str,
        Field(min_length=1, max_length=512, json_schema_extra={"pattern": MODEL_PATTERN}),
        AfterValidator(_check_model),
    ] = Field(description="Model name or path, passed to the engine.")
    image: ImageRef | None = _omittable("Container image; defaults to the engine's image.")
    replicas: StrictInt = Field(1, ge=1, le=1000, description="Serving replicas.")
    gpu: GpuSpec = _section(GpuSpec, "GPUs per replica.")
    startup_timeout: PositiveDuration | None = _omittable(
        "How long an engine may load before Kubernetes restarts it (the startupProbe); by default sized "
        "from the model's weights per GPU at a conservative load rate."
    )
    extra_args: Annotated[list[ExtraArg], Field(max_length=MAX_EXTRA_ARGS)] = Field(
        default_factory=list,
        description="Extra engine arguments, one token per item; may not set flags the operator owns.",
    )
    config: ConfigSpec = _section(ConfigSpec, "Baseline knob values (engine defaults when omitted).")
    routing: RoutingSpec = _section(
        RoutingSpec, "The router in front of the engine pods (replicas >= 2) and its settings."
    )
    tuning: TuningSpec = _section(TuningSpec, "Online tuning.")
    api_key_secret: SecretKeyRef | None = _omittable(
        "The engine's API key, from a Secret (never in extraArgs): vLLM reads it as VLLM_API_KEY, "
        "SGLang as --api-key from the environment."
    )
    resources: EngineResources | None = _omittable(
        "CPU/memory requests of each engine pod; default sized from the model's weights and the GPUs."
    )
    adopt: AdoptSpec | None = _omittable(
        "Tune an existing engine Deployment in place instead of creating one: trials run on the "
        "operator's canary Deployment, the adopted one only ever runs the best config, and deleting "
        "this resource leaves it running."
    )
    pod: PodOverrides | None = _omittable(
        "The engine pod's environment, volumes, scheduling and pull secrets, merged under the "
        "operator's own fields."
    )

    @model_validator(mode="after")
    def _engine_rules(self, info: ValidationInfo) -> ServingDeploymentSpec:
        # Engine-specific and cross-field rules, with exact paths. validate_spec passes a list in the
        # context to collect them; a plain model_validate raises them all at once.
        problems = rules.check_spec(self)
        rules.fill_defaults(self)
        collector = info.context.get(rules.COLLECT_KEY) if isinstance(info.context, dict) else None
        if isinstance(collector, list):
            collector.extend(problems)
        elif problems:
            raise ValueError("; ".join(f"spec.{path}: {message}" for path, message in problems))
        return self

    def knob_config(self) -> KnobConfig:
        """spec.config as a KnobConfig (engine defaults filled in), with the routing knobs' baseline
        from spec.routing."""
        return self.config.to_knob_config().with_(**self.routing.knob_values())

    def effective_rollout(self) -> RolloutStrategy:
        assert self.tuning.rollout.strategy is not None  # filled in by validation
        return self.tuning.rollout.strategy

    def search_space(self) -> dict[str, KnobSpec]:
        """The adapter's knob specs narrowed by spec.tuning.space (see rules.search_space)."""
        return rules.search_space(self)


# --- status ----------------------------------------------------------------------------------------


Ratio = Annotated[StrictFloat, Field(ge=0, le=1)]


class Condition(_Model):
    type: ConditionType
    status: ConditionStatus
    reason: Annotated[
        str, Field(min_length=1, max_length=1024, pattern=r"^[A-Za-z]([A-Za-z0-9_,:]*[A-Za-z0-9_])?$")
    ]
    message: Annotated[str, Field(max_length=32768)] = ""
    last_transition_time: AwareDatetime
    observed_generation: Annotated[StrictInt, Field(ge=0)] | None = _omittable()


class BestConfig(_Model):
    config: KnobValues
    score: StrictFloat | None = Field(None, description="Objective value of the best trial.")
    trial: Annotated[StrictInt, Field(ge=0)] | None = _omittable(
        "The best trial's index in status.trials (its score's basis and terms are there)."
    )
    confidence: Ratio | None = Field(
        None,
        description="Confidence that the best config's gain over the deployed one is at least minGain, "
        "0..1 (the significance gate's noise model: counting noise and window-to-window variance).",
    )
    gain: StrictFloat | None = _omittable(
        "The measured gain of the best config by mean over the deployed one (0.05: 5% better)."
    )
    min_gain: Ratio | None = _omittable("spec.tuning.minGain the gain is held to.")
    required_confidence: Ratio | None = _omittable("spec.tuning.confidence, the confidence needed.")
    window_noise: Annotated[StrictFloat, Field(ge=0)] | None = _omittable(
        "Relative standard deviation of one window's score under the noise model."
    )
    significant: StrictBool | None = _omittable(
        "The significance gate's decision at convergence: false keeps the deployed config (no "
        "significant gain; candidate is the config that scored best by mean); absent while exploring."
    )
    candidate: KnobValues | None = _omittable(
        "The config that scored best by mean when the gate kept the deployed config."
    )


class TrialBudget(_Model):
    """How much of spec.tuning.budget.maxTrials the current tuning run (epoch) has spent."""

    used: Annotated[StrictInt, Field(ge=0)] = Field(
        description="Trials of this tuning run that count toward maxTrials: every trial started, the one "
        "in flight too, but the baseline and those re-run at no cost (invalidated by a pod restart, a "
        "spec change or a lack of capacity, or aborted by an invalid spec)."
    )
    max_trials: Annotated[StrictInt, Field(ge=1)] = Field(description="spec.tuning.budget.maxTrials.")


class ScoreTerms(_Model):
    """The terms a trial's score was computed from (which apply depends on its scoreBasis)."""

    baseline_trial: Annotated[StrictInt, Field(ge=0)] | None = _omittable(
        "paired-with-baseline: the trial whose score anchors this one (the config the stable pods ran)."
    )
    baseline_score: StrictFloat | None = _omittable(
        "paired-with-baseline: that trial's score. score = baselineScore * ratio (the ttft objective: "
        "baselineScore / ratio)."
    )
    ratio: StrictFloat | None = _omittable(
        "paired-with-baseline: how much better the canary did than the stable pods over the same window "
        "(> 1: better): (windowScore / canaryPods) / (baselineWindowScore / baselinePods) / requestSplit "
        "(the ttft objective: baselineWindowScore / windowScore)."
    )
    baseline_window_score: StrictFloat | None = _omittable(
        "paired-with-baseline: the stable pods' own score over the same window."
    )
    canary_pods: Annotated[StrictInt, Field(ge=1)] | None = _omittable(
        "paired-with-baseline: pods under test."
    )
    baseline_pods: Annotated[StrictInt, Field(ge=1)] | None = _omittable("paired-with-baseline: stable pods.")
    request_split: StrictFloat | None = _omittable(
        "paired-with-baseline, goodput: the canary's requests per pod over the stable pods', within "
        "[0.5, 2] (goodput follows the requests a side was sent); 1 for the other objectives."
    )
    load_factor: StrictFloat | None = _omittable(
        "load-normalized: referenceRps / offeredRps within [0.5, 2]. score = windowScore * loadFactor."
    )
    offered_rps: StrictFloat | None = _omittable("load-normalized: the arrival rate over the window.")
    reference_rps: StrictFloat | None = _omittable(
        "load-normalized: the arrival rate of the tuning run's baseline window (what every window is "
        "rescaled to)."
    )
    measured_score: StrictFloat | None = _omittable(
        "goodput, throughput: the objective as measured over the window (SLO penalty applied). "
        "windowScore = measuredScore * headroom."
    )
    headroom: StrictFloat | None = _omittable(
        "goodput, throughput: how much more load the window's config would carry within the SLOs, "
        "1 / the largest share of a budget its load used (TTFT p99 / TTFT SLO, ITL p50 / ITL SLO, KV "
        "cache usage, running batch peak / the config's running-request cap), within [1, 20]: 1 at "
        "saturation, where the score is the measured rate."
    )
    headroom_limit: HeadroomLimit | None = _omittable(
        "The budget with the largest share (ttft, itl, kv-pool, running-cap)."
    )


class TrialRecord(_Model):
    index: Annotated[StrictInt, Field(ge=0)] = Field(description="Trial number, assigned once, increasing.")
    role: TrialRole | None = _omittable(
        "baseline: the running config measured at the start of a tuning run; trial: a config tried."
    )
    config: KnobValues
    outcome: TrialOutcome
    reason: str = ""
    started_at: AwareDatetime | None = None
    finished_at: AwareDatetime | None = None
    signals: dict[str, StrictFloat | None] = Field(
        default_factory=dict,
        description="Measured signals (null: not measured).",
        json_schema_extra={"x-kubernetes-preserve-unknown-fields": True},
    )
    score: StrictFloat | None = Field(
        None,
        description="What the tuner compares trials by (objective units), made from the window as "
        "scoreBasis says.",
    )
    score_basis: ScoreBasis | None = _omittable(
        "How score was made: measured (the window's own score), paired-with-baseline (a canary: the "
        "stable config's score times the same-window ratio) or load-normalized (rolling: the window's "
        "score times a load factor). The terms are in scoreTerms."
    )
    window_score: StrictFloat | None = _omittable(
        "The objective as measured over the window on the pods under test (for a canary, its pods "
        "only): raw, not comparable across trials unless scoreBasis is measured."
    )
    score_terms: ScoreTerms | None = _omittable("The terms score was computed from (see scoreBasis).")
    kv_tokens: StrictInt | None = Field(
        None, description="The KV pool the engine reported running (tokens), read back after the rollout."
    )


class DiagnosisStatus(_Model):
    bound: Bound = Bound.UNKNOWN
    hit_rate: Ratio | None = Field(None, description="Prefix-cache hit rate (tokens), 0..1.")
    prefill_reduction: Ratio | None = Field(None, description="Share of prompt tokens not recomputed, 0..1.")
    notes: list[str] = Field(default_factory=list)


class Recommendation(_Model):
    """What observe mode would roll out, and why."""

    id: str | None = _omittable(
        "Names this recommendation: approve it with the annotation prefixtune.io/approve set to it."
    )
    config: KnobValues
    reason: str
    score: StrictFloat | None = Field(None, description="Expected objective value (measured or the twin's).")


class RouterWorker(_Model):
    """One engine worker as the router counts it."""

    worker: Annotated[str, Field(max_length=512)] = Field(
        description="The engine pod (its name; the router's worker URL where the pod is not known)."
    )
    requests: Annotated[StrictFloat, Field(ge=0)] = Field(description="Requests the router sent it.")
    share: Ratio = Field(description="Its share of the requests the router sent.")


class RoutingStatus(_Model):
    """The router in front of the engines and what it did (its own metrics, summed over its pods,
    since they started; refreshed about once a minute)."""

    policy: Annotated[str, Field(max_length=64)] = Field(
        description="The policy running (auto resolved): kube-proxy when no router runs."
    )
    router: Router | None = _omittable("The router, when one runs.")
    requests: Annotated[StrictFloat, Field(ge=0)] | None = _omittable("Requests the router sent.")
    workers: Annotated[list[RouterWorker], Field(max_length=32)] = Field(
        default_factory=list, description="Per-worker request share, largest first (at most 32)."
    )
    other_workers: Annotated[StrictInt, Field(ge=0)] | None = _omittable("Workers beyond those listed.")
    cache_aware_decisions: Annotated[StrictFloat, Field(ge=0)] | None = _omittable(
        "Requests routed by the prefix tree (to the worker holding the prefix, or the smallest tree); "
        "omitted when the router exports no such metric (sglang-router 0.3.2)."
    )
    load_balanced_decisions: Annotated[StrictFloat, Field(ge=0)] | None = _omittable(
        "Requests sent to the least-loaded worker instead (the load was imbalanced)."
    )
    tokenless_decisions: Annotated[StrictFloat, Field(ge=0)] | None = _omittable(
        "Requests routed by load alone because the engines answered no token ids (vllm-router's "
        "missing_tokens: engines without vLLM's render routes); omitted for sglang-router."
    )
    message: Annotated[str, Field(max_length=1024)] = Field(
        "", description="Why something above is missing (no router pod ready, a scrape failed)."
    )


class ServingDeploymentStatus(_Model):
    phase: Phase = Phase.PENDING
    observed_generation: Annotated[StrictInt, Field(ge=0)] | None = _omittable()
    conditions: list[Condition] = Field(
        default_factory=list,
        json_schema_extra={"x-kubernetes-list-type": "map", "x-kubernetes-list-map-keys": ["type"]},
    )
    current_config: KnobValues | None = _omittable("The configuration the serving pods run.")
    best_config: BestConfig | None = _omittable("The best configuration measured so far.")
    budget: TrialBudget | None = _omittable("The trial budget spent by the current tuning run.")
    trials: list[TrialRecord] = Field(default_factory=list)
    diagnosis: DiagnosisStatus | None = _omittable("What limits the deployment now.")
    routing: RoutingStatus | None = _omittable("The router in front of the engines (spec.routing).")
    recommendation: Recommendation | None = _omittable("Observe mode: what would be rolled out.")
    replicas: Annotated[StrictInt, Field(ge=0)] | None = _omittable(
        "Engine pods that exist (baseline and canary Deployments' status.replicas, ready or not): the "
        "scale subresource's status.replicas."
    )
    selector: Annotated[str, Field(max_length=1024)] | None = _omittable(
        "Label selector of the engine pods, as a string: the scale subresource's status.selector "
        "(what an HPA reads the pods' metrics by)."
    )
    policy: dict[str, Any] = Field(
        default_factory=dict,
        description="State of the tuning policy (opaque; owned by the policy state machine).",
        json_schema_extra={"x-kubernetes-preserve-unknown-fields": True},
    )


class ServingDeployment(_Model):
    api_version: Literal["prefixtune.io/v1alpha1"] = GROUP_VERSION
    kind: Literal["ServingDeployment"] = KIND
    # ObjectMeta is the API server's business; kept as given. (The CRD's root schema is written in
    # crd.py, where metadata is a plain object as Kubernetes requires.)
    metadata: dict[str, Any] = Field(
        default_factory=dict, json_schema_extra={"x-kubernetes-preserve-unknown-fields": True}
    )
    spec: ServingDeploymentSpec
    status: ServingDeploymentStatus | None = _omittable()
