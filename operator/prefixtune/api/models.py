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
from typing import TYPE_CHECKING, Annotated, Any, Final, Literal, Self

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
    MetricsSource,
    Objective,
    Phase,
    RolloutStrategy,
    TrialOutcome,
    TuningMode,
)
from prefixtune.engines.base import EngineName, KnobConfig, KnobSpec
from prefixtune.engines.knobs import KNOBS, Knob, KnobKind

API_GROUP = "prefixtune.io"
API_VERSION = "v1alpha1"
GROUP_VERSION: Final = "prefixtune.io/v1alpha1"
KIND: Final = "ServingDeployment"
LIST_KIND = "ServingDeploymentList"
PLURAL = "servingdeployments"
SINGULAR = "servingdeployment"
SHORT_NAMES = ("sdep",)
CATEGORIES = ("prefixtune",)

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
    """A model with one field per registry knob (added by ``_knob_model``)."""

    def knob_values(self) -> dict[str, Any]:
        """{knob name: field value} in registry order (None where a knob is omitted)."""
        return {knob.name: getattr(self, knob.name) for knob in KNOBS}

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
        return cls.model_validate(config.to_dict())


class _ConfigSpec(_KnobFields):
    """The baseline configuration of the tuned knobs. Omitted knobs take the engine's default."""


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
}


def _space_type(knob: Knob) -> Any:
    """A fraction is searched over a range; any other knob over a list of its values."""
    if knob.continuous:
        return FloatRange
    most = 2 if knob.kind is KnobKind.SWITCH else 16
    values: Any = list.__class_getitem__(_VALUE_TYPE[knob.kind])  # a type built at runtime
    return Annotated[values, Field(min_length=1, max_length=most)]


def _knob_model(base: type[_Model], field: Callable[[Knob], tuple[Any, Any]]) -> Any:
    """``base`` with one field per registry knob, in registry order (names, docs and types from it)."""
    fields: dict[str, Any] = {knob.name: field(knob) for knob in KNOBS}
    name = base.__name__.lstrip("_")
    return create_model(name, __base__=base, __module__=__name__, __doc__=base.__doc__, **fields)


if TYPE_CHECKING:  # the static type is the base with the knob methods; fields are read by name
    ConfigSpec = _ConfigSpec
    SearchSpaceSpec = _SearchSpaceSpec
    KnobValues = _KnobValues
else:
    ConfigSpec = _knob_model(
        _ConfigSpec, lambda knob: (_VALUE_TYPE[knob.kind] | None, _omittable(knob.config_doc))
    )
    SearchSpaceSpec = _knob_model(
        _SearchSpaceSpec,
        lambda knob: (
            _space_type(knob) | None,
            _omittable(knob.space_doc, None if knob.continuous else _SET),
        ),
    )
    KnobValues = _knob_model(_KnobValues, lambda knob: (_VALUE_TYPE[knob.kind], ...))


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
    objective: Objective = Field(Objective.GOODPUT, description="What the tuner maximises.")
    slo: SloSpec = _section(SloSpec, "Latency objectives.")
    space: SearchSpaceSpec = _section(SearchSpaceSpec, "Search space; defaults come from the engine adapter.")
    trial: TrialSpec = _section(TrialSpec, "Trial timing.")
    budget: BudgetSpec = _section(BudgetSpec, "Trial budget.")
    rollout: RolloutSpec = _section(RolloutSpec, "How trial configurations are rolled out.")
    drift: DriftSpec = _section(DriftSpec, "When to re-tune.")
    metrics: MetricsSpec = _section(MetricsSpec, "Where signals come from.")


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


class ServingDeploymentSpec(_Model):
    """A GPU serving deployment of one model on one engine, and how to tune it."""

    engine: EngineName = Field(description="Serving engine: vllm, sglang or trtllm.")
    model: Annotated[
        str,
        Field(min_length=1, max_length=512, json_schema_extra={"pattern": MODEL_PATTERN}),
        AfterValidator(_check_model),
    ] = Field(description="Model name or path, passed to the engine.")
    image: (
        Annotated[
            str,
            Field(min_length=1, max_length=512),
            AfterValidator(_check_image),
            WithJsonSchema(
                {"type": "string", "minLength": 1, "maxLength": 512, "pattern": references.IMAGE_PATTERN}
            ),
        ]
        | None
    ) = _omittable("Container image; defaults to the engine's image.")
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
    tuning: TuningSpec = _section(TuningSpec, "Online tuning.")
    api_key_secret: SecretKeyRef | None = _omittable(
        "The engine's API key, from a Secret (never in extraArgs): vLLM reads it as VLLM_API_KEY, "
        "SGLang as --api-key from the environment."
    )
    resources: EngineResources | None = _omittable(
        "CPU/memory requests of each engine pod; default sized from the model's weights and the GPUs."
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
        """spec.config as a KnobConfig (engine defaults filled in)."""
        return self.config.to_knob_config()

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
    confidence: Ratio | None = Field(None, description="Confidence that it beats the baseline, 0..1.")


class TrialBudget(_Model):
    """How much of spec.tuning.budget.maxTrials the current tuning run (epoch) has spent."""

    used: Annotated[StrictInt, Field(ge=0)] = Field(
        description="Trials of this tuning run that count toward maxTrials: every trial started, the one "
        "in flight too, but the baseline and those re-run at no cost (invalidated by a pod restart, a "
        "spec change or a lack of capacity, or aborted by an invalid spec)."
    )
    max_trials: Annotated[StrictInt, Field(ge=1)] = Field(description="spec.tuning.budget.maxTrials.")


class TrialRecord(_Model):
    index: Annotated[StrictInt, Field(ge=0)] = Field(description="Trial number, assigned once, increasing.")
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
    score: StrictFloat | None = None
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

    config: KnobValues
    reason: str
    score: StrictFloat | None = Field(None, description="Expected objective value (measured or the twin's).")


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
