"""Engine-specific and cross-field rules of a ServingDeployment spec, and its engine defaults.

Everything engine-specific comes from the engine adapter (``knobs()``, ``default_config()``,
``tuned_flags()``, ``validate()``, ``default_image``); nothing here lists block sizes or flags.
Problems are ``(path, message)`` with the path relative to ``spec`` ("config.blockSize").
"""

from __future__ import annotations

import itertools
import re
import unicodedata
from collections.abc import Sequence
from dataclasses import replace
from typing import TYPE_CHECKING
from urllib.parse import urlsplit

from pydantic.alias_generators import to_camel

from prefixtune.api.enums import RolloutStrategy, TuningMode
from prefixtune.api.secret_flags import secret_flag_problems
from prefixtune.engines import get_adapter
from prefixtune.engines._argv import looks_like_flag
from prefixtune.engines.base import EngineAdapter, Hardware, KnobConfig, KnobSpec
from prefixtune.engines.knobs import BY_NAME, ENGINE_KNOBS, KNOBS, ROUTING_POLICY, KnobKind
from prefixtune.routing.policy import AUTO_POLICY, DEFAULT_ROUTER_IMAGE, RoutingPolicy
from prefixtune.routing.settings import ENGINE_ROUTER, policy_problem

if TYPE_CHECKING:
    from prefixtune.api.models import ServingDeploymentSpec

# The validation context key under which validate_spec passes a list that collects problems.
COLLECT_KEY = "prefixtune.collect"

Problem = tuple[str, str]

# Where to set what an owned flag would set, for flags that are not one of the four knobs.
_TENSOR_PARALLEL_WORDS = {"tp", "tensor"}
_MODEL_WORDS = {"model", "model-path"}
_OPERATOR_WORDS = {"port", "host"}
# Unicode categories refused in extraArgs: controls (Cc) and invisible format characters (Cf).
_CONTROL_CATEGORIES = frozenset({"Cc", "Cf"})


def knob_field(knob: str) -> str:
    """The camelCase spec field of an engine-neutral knob ("block_size" -> "blockSize")."""
    return to_camel(knob)


def show(value: object) -> str:
    """A value as the user wrote it in YAML (true/false, numbers bare, strings quoted)."""
    if isinstance(value, bool):
        return "true" if value else "false"
    if isinstance(value, str):
        return repr(value)
    return str(value)


def allowed_text(spec: KnobSpec) -> str:
    if spec.continuous:
        return f"a number in {spec.range_text()}"
    if spec.open_range:
        unset = BY_NAME[spec.name].unset
        auto = f" (or {unset}: the engine's own default)" if unset is not None else ""
        return f"{'an integer' if spec.integer else 'a number'} in {spec.range_text()}{auto}"
    return ", ".join(show(c) if isinstance(c, bool) else str(c) for c in spec.choices)


def knob_problem(engine: str, spec: KnobSpec, value: object) -> str | None:
    """None when ``value`` is valid for the knob, else a message that names the allowed values."""
    if spec.validate(value) is None:
        return None
    if spec.continuous or spec.open_range:
        return f"{show(value)} is outside the range {engine} allows; allowed: {allowed_text(spec)}"
    return f"{show(value)} is not supported by {engine}; allowed: {allowed_text(spec)}"


# Engines whose server checks an API key (vLLM reads VLLM_API_KEY, vllm/envs.py; SGLang takes
# --api-key, sglang/srt/server_args.py); trtllm-serve has no such option. How each gets the key from
# the Secret: controller/engine_pod.py.
API_KEY_ENGINES = frozenset({"vllm", "sglang"})


def check_spec(spec: ServingDeploymentSpec) -> list[Problem]:
    adapter = get_adapter(spec.engine)
    problems: list[Problem] = []
    problems += _check_config(adapter, spec)
    problems += _check_space(adapter, spec)
    problems += _check_extra_args(adapter, spec.extra_args, spec.model, spec.gpu.count)
    problems += _check_version(adapter, spec)
    problems += _check_combination(adapter, spec)
    problems += _check_rollout(spec)
    problems += _check_adopt(spec)
    problems += _check_metrics(spec)
    problems += secret_flag_problems(spec.extra_args)
    problems += _check_secret_ref(spec)
    problems += _check_pod(adapter, spec)
    problems += _check_routing(spec)
    return problems


def fill_defaults(spec: ServingDeploymentSpec) -> None:
    """Engine defaults for what the user left out (image, knobs, rollout strategy). In place: this
    runs inside the model's own validator, before anyone else sees the object."""
    adapter = get_adapter(spec.engine)
    if spec.image is None:
        spec.image = adapter.default_image
    config = spec.config
    filled = filled_config(adapter, spec)
    for knob in config.knob_fields:
        if getattr(config, knob.name) is None:
            setattr(config, knob.name, filled.get(knob.name))
    routing = spec.routing
    if routing.router is None:
        routing.router = ENGINE_ROUTER[spec.engine]
    if routing.image is None:
        routing.image = DEFAULT_ROUTER_IMAGE[routing.router]
    rollout = spec.tuning.rollout
    if rollout.strategy is None:
        rollout.strategy = RolloutStrategy.CANARY if spec.replicas >= 2 else RolloutStrategy.ROLLING


def filled_config(adapter: EngineAdapter, spec: ServingDeploymentSpec) -> KnobConfig:
    """spec.config with each omitted knob at the engine's own default for the spec's GPU (the
    adapter's GPU-neutral default for a GPU the twin does not model). A default that depends on a
    pinned knob follows it (SGLang's memory fraction on the chunk); a batch limit whose GPU default
    the extra args exclude (vLLM with chunked prefill off raises its budget to max_model_len itself)
    is left to the engine."""
    hardware = hardware_of(spec)
    pinned = {name: value for name, value in spec.config.knob_values().items() if value is not None}
    base = adapter.default_config() if hardware is None else adapter.default_config_for(hardware, pinned)
    values = base.to_dict()
    narrowed = adapter.allowed_choices(spec.extra_args)
    knobs = adapter.knobs()
    for knob in KNOBS:
        if knob.name in pinned or knob.unset is None or knob.name not in narrowed:
            continue
        if not knobs[knob.name].allows(values[knob.name], narrowed[knob.name]):
            values[knob.name] = knob.unset
    return KnobConfig.from_dict(values)


def hardware_of(spec: ServingDeploymentSpec) -> Hardware | None:
    """What the engines' own defaults read of the spec's GPU (its name and memory as CUDA reports
    it: the twin's GPU catalog holds the figures) at its TP degree; None for a GPU type the twin does
    not model (the knobs then keep the adapter's GPU-neutral defaults)."""
    from prefixtune.twin.catalog import find_gpu

    found = find_gpu(spec.gpu.type)
    if found is None:
        return None
    return Hardware(found.name, float(found.memory_bytes), spec.gpu.count)


def gpu_notes(spec: ServingDeploymentSpec) -> list[str]:
    """What the twin cannot tell of this spec's GPU: the note for a type it does not model (status,
    ``prefixtune render``), empty for one it does."""
    from prefixtune.twin.catalog import find_gpu, no_twin_model

    if find_gpu(spec.gpu.type) is not None:
        return []
    return [
        f"{no_twin_model(spec.gpu.type)}: the starting config takes the engine's defaults, not ones "
        "sized to this GPU's memory (set spec.config to choose), and tuning works from measurements only"
    ]


def _overlap(a: str, b: str) -> bool:
    """Whether two absolute paths are the same or one holds the other."""
    a, b = a.rstrip("/") or "/", b.rstrip("/") or "/"
    return a == b or b.startswith(a.rstrip("/") + "/") or a.startswith(b.rstrip("/") + "/")


def _owned_paths(adapter: EngineAdapter, spec: ServingDeploymentSpec) -> list[str]:
    """The paths the operator mounts in the engine container: /dev/shm and the engine's option files
    (their paths do not depend on the knob values)."""
    from prefixtune.api.owned import SHM_PATH

    try:
        files = adapter.render(spec.model, adapter.default_config(), (), None, spec.gpu.count).files
    except ValueError:
        files = {}
    return [SHM_PATH, *sorted(files)]


# An emptyDir of huge pages needs the pod to request them (spec.resources fields).
_HUGE_PAGES = {
    "HugePages-2Mi": ("hugepages_2mi",),
    "HugePages-1Gi": ("hugepages_1gi",),
    "HugePages": ("hugepages_2mi", "hugepages_1gi"),
}


def _check_pod(adapter: EngineAdapter, spec: ServingDeploymentSpec) -> list[Problem]:
    """spec.pod against the names the operator owns (``api.owned``) and against itself: a collision
    is refused with the field's path, never overwritten."""
    from prefixtune.api import owned
    from prefixtune.api.models import EngineResources

    pod = spec.pod
    if pod is None:
        return []
    problems: list[Problem] = []
    seen: set[str] = set()
    for i, var in enumerate(pod.env):
        where = f"pod.env[{i}].name"
        if owned.owned_env(var.name):
            hint = " (give the API key as spec.apiKeySecret)" if var.name in owned.OWNED_ENV else ""
            problems.append((where, f"{var.name} is set by the operator{hint}"))
        elif var.name in seen:
            problems.append((where, f"{var.name} is set twice"))
        seen.add(var.name)
    names: set[str] = set()
    resources = spec.resources
    for i, volume in enumerate(pod.volumes):
        if volume.name in owned.OWNED_VOLUMES:
            problems.append((f"pod.volumes[{i}].name", f"{volume.name} is a volume of the operator"))
        elif volume.name in names:
            problems.append((f"pod.volumes[{i}].name", f"{volume.name} is given twice"))
        names.add(volume.name)
        medium = str(volume.empty_dir.medium or "") if volume.empty_dir is not None else ""
        needs = _HUGE_PAGES.get(medium, ())
        if needs and not any(getattr(resources, field, None) is not None for field in needs):
            wanted = " or ".join(f"spec.resources.{EngineResources.model_fields[f].alias}" for f in needs)
            problems.append(
                (f"pod.volumes[{i}].emptyDir.medium", f"{medium} needs huge pages in the pod: set {wanted}")
            )
    mounted: list[str] = []
    taken = _owned_paths(adapter, spec) if pod.volume_mounts else []
    for i, mount in enumerate(pod.volume_mounts):
        if mount.name not in names:
            problems.append((f"pod.volumeMounts[{i}].name", f"no volume {mount.name!r} in spec.pod.volumes"))
        clash = next((path for path in taken if _overlap(path, mount.mount_path)), None)
        if clash is not None:
            problems.append(
                (
                    f"pod.volumeMounts[{i}].mountPath",
                    f"{mount.mount_path} overlaps {clash}, mounted by the operator",
                )
            )
        elif mount.mount_path.rstrip("/") in mounted:
            problems.append((f"pod.volumeMounts[{i}].mountPath", f"{mount.mount_path} is mounted twice"))
        if mount.sub_path is not None and ".." in mount.sub_path.split("/"):
            problems.append((f"pod.volumeMounts[{i}].subPath", "may not contain '..'"))
        mounted.append(mount.mount_path.rstrip("/"))
    maps: tuple[tuple[str, dict[str, str] | None, frozenset[str]], ...] = (
        ("labels", pod.labels, owned.OWNED_LABELS),
        ("annotations", pod.annotations, owned.OWNED_ANNOTATIONS),
    )
    for field, mapping, taken_keys in maps:
        for key in sorted(mapping or {}):
            if owned.owned_key(key, taken_keys):
                problems.append((f"pod.{field}[{key}]", f"{key} is set by the operator"))
    return problems


def narrowed_choices(adapter: EngineAdapter, extra_args: Sequence[str]) -> dict[str, KnobSpec]:
    """The adapter's knobs with the values the extra args exclude removed (SGLang's priority
    scheduling starts only with fcfs or lof): the tuner never searches a config the engine refuses."""
    knobs = dict(adapter.knobs())
    for knob, allowed in adapter.allowed_choices(extra_args).items():
        spec = knobs[knob]
        knobs[knob] = replace(spec, choices=tuple(c for c in spec.choices if c in allowed))
    return knobs


def search_space(spec: ServingDeploymentSpec) -> dict[str, KnobSpec]:
    """The effective search space: the adapter's knob specs narrowed by spec.tuning.space.

    A knob the user did not list keeps the adapter's spec (``searched`` says whether the tuner
    varies it; an unsearched knob stays at spec.config's value). A knob the user listed is searched
    over exactly the listed values (or the given range).
    """
    adapter = get_adapter(spec.engine)
    knobs = narrowed_choices(adapter, spec.extra_args)
    for knob, values in spec.tuning.space.listed().items():
        if BY_NAME[knob].continuous:
            knobs[knob] = replace(
                knobs[knob], low=float(values.min), high=float(values.max), low_exclusive=False, searched=True
            )
        else:
            knobs[knob] = replace(knobs[knob], choices=tuple(values), searched=True)
    return knobs


# --- the checks ------------------------------------------------------------------------------------


def _check_config(adapter: EngineAdapter, spec: ServingDeploymentSpec) -> list[Problem]:
    problems: list[Problem] = []
    knobs = adapter.knobs()
    given = spec.config.knob_values()
    flagged: set[str] = set()
    for knob, value in given.items():
        if value is None:
            continue
        message = knob_problem(adapter.name, knobs[knob], value)
        if message is not None:
            problems.append((f"config.{knob_field(knob)}", message))
            flagged.add(knob)
    if not flagged:
        # Rules across knobs, if the adapter has any, on the config filled in for the GPU.
        for knob, message in adapter.validate(filled_config(adapter, spec)):
            problems.append((f"config.{knob_field(knob)}", message))
    return problems


def _check_space(adapter: EngineAdapter, spec: ServingDeploymentSpec) -> list[Problem]:
    problems: list[Problem] = []
    knobs = adapter.knobs()
    listed = spec.tuning.space.listed()
    for name, bounds in listed.items():
        if not BY_NAME[name].continuous:
            continue
        knob = knobs[name]
        low, high = bounds.min, bounds.max
        for end, value in (("min", low), ("max", high)):
            message = knob_problem(adapter.name, knob, value)
            if message is not None:
                problems.append((f"tuning.space.{knob_field(name)}.{end}", message))
        if low >= high:
            problems.append(
                (
                    f"tuning.space.{knob_field(name)}",
                    f"min ({show(low)}) must be less than max ({show(high)}); "
                    f"allowed: min < max, both in {knob.range_text()}",
                )
            )
    for name, values in listed.items():
        if BY_NAME[name].continuous:
            continue
        seen: set[object] = set()
        for i, item in enumerate(values):
            path = f"tuning.space.{knob_field(name)}[{i}]"
            message = knob_problem(adapter.name, knobs[name], item)
            if message is not None:
                problems.append((path, message))
            elif item in seen:
                problems.append((path, f"duplicate value {show(item)}; list each value once"))
            seen.add(item)
    return problems or _check_space_combinations(adapter, spec)


def _check_space_combinations(adapter: EngineAdapter, spec: ServingDeploymentSpec) -> list[Problem]:
    """Every combination of the listed integer knobs (each other knob at spec.config's value) must
    pass the engine's rules across knobs (vLLM: token budget >= running cap): the tuner may try any."""
    listed = spec.tuning.space.listed()
    integers = [k.name for k in KNOBS if k.kind is KnobKind.INTEGER and k.name in listed]
    if not integers:
        return []
    try:
        base = filled_config(adapter, spec)
    except (ValueError, TypeError):
        return []  # spec.config itself is refused; its own problem says why
    candidates = [[(name, value) for value in listed[name]] for name in integers]
    for combination in itertools.product(*candidates):
        for knob, message in adapter.cross_check(base.with_(**dict(combination))):
            field = knob if knob in listed else integers[0]
            shown = ", ".join(f"{knob_field(n)} {show(v)}" for n, v in combination)
            return [(f"tuning.space.{knob_field(field)}", f"{shown}: {message}; narrow the space")]
    return []


def _check_version(adapter: EngineAdapter, spec: ServingDeploymentSpec) -> list[Problem]:
    """Extra args that parse but that the image's engine release refuses at start."""
    version = adapter.version_of(spec.image or adapter.default_image)
    return [
        (f"extraArgs[{i}]", message) for i, message in adapter.refused_for_version(version, spec.extra_args)
    ]


def _check_combination(adapter: EngineAdapter, spec: ServingDeploymentSpec) -> list[Problem]:
    """Knob values (spec.config, tuning.space) that the engine refuses at start with the extra args."""
    allowed = adapter.allowed_choices(spec.extra_args)
    if not allowed:
        return []
    problems: list[Problem] = []
    given = spec.config.knob_values()
    listed = {
        name: values for name, values in spec.tuning.space.listed().items() if not BY_NAME[name].continuous
    }
    knobs = adapter.knobs()
    for knob, values in allowed.items():
        spec_ = knobs[knob]
        if spec_.open_range:
            numbers = [int(v) for v in values if isinstance(v, int)]
            text = f"{min(numbers)} to {int(spec_.high or 0)}" if numbers else "none"
            unset = BY_NAME[knob].unset
            text += f", or {unset} (the engine's own default)" if unset is not None else ""
        else:
            text = ", ".join(str(v) for v in values)
        why = f"{adapter.name} refuses to start with it given spec.extraArgs; allowed: {text}"
        value = given.get(knob)
        if value is not None and not spec_.allows(value, values):
            problems.append((f"config.{knob_field(knob)}", f"{show(value)}: {why}"))
        for i, item in enumerate(listed.get(knob) or ()):
            if not spec_.allows(item, values):
                problems.append((f"tuning.space.{knob_field(knob)}[{i}]", f"{show(item)}: {why}"))
    return problems


def _norm(flag: str) -> str:
    # vLLM and SGLang accept underscores for dashes; compare spellings in one form.
    return flag.replace("_", "-")


def _words(flag: str) -> set[str]:
    return {w for w in re.split(r"[-_/]+", flag.lower()) if w}


def _instead(adapter: EngineAdapter, flag: str) -> str:
    """Which spec field to use instead of an owned ``flag``."""
    knobs = adapter.knobs()
    norm = _norm(flag)
    for knob, spec in knobs.items():
        spellings = {_norm(s.strip()) for s in spec.flag.split("/") if s.strip()}
        if norm in spellings:
            return f"use spec.config.{knob_field(knob)} (and spec.tuning.space.{knob_field(knob)}) instead"
    if norm in {_norm(f) for f in adapter.routing_flags()}:
        return (
            "spec.routing decides it: the engines serve what a router needs whenever one may be in "
            "front (spec.routing.policy other than kube-proxy, or a router policy in "
            "spec.tuning.space.routingPolicy)"
        )
    words = _words(flag)
    if words & _TENSOR_PARALLEL_WORDS:
        return "use spec.gpu.count (the tensor-parallel size) instead"
    if norm.lstrip("-") in _MODEL_WORDS:
        return "use spec.model instead"
    if norm.lstrip("-") in _OPERATOR_WORDS:
        return "the operator sets it (the Service and probes depend on it)"
    # Aliases and conflicting flags: the knob whose flag shares the most words, if clearly related.
    best, overlap = "", 1
    for knob, spec in knobs.items():
        common = len(words & _words(spec.flag))
        if common > overlap:
            best, overlap = knob, common
    if best:
        return f"use spec.config.{knob_field(best)} (and spec.tuning.space.{knob_field(best)}) instead"
    fields = ", ".join(f"spec.config.{knob_field(k.name)}" for k in ENGINE_KNOBS)
    return f"the operator renders it itself (the tuned knobs are {fields})"


def owned_flag_hits(adapter: EngineAdapter, args: Sequence[str]) -> list[tuple[int, str, bool]]:
    """(index, owned flag, abbreviated) for every item of ``args`` that sets an owned flag, written
    as ``--flag``, ``--flag=value``, with underscores, or as an argparse-style abbreviation."""
    flags = adapter.tuned_flags()
    owned: dict[str, str] = {}
    for flag in sorted(flags, key=lambda f: (f.count("_"), f)):  # the dash spelling names the flag
        owned.setdefault(_norm(flag), flag)
    long_owned = [n for n in owned if n.startswith("--")]
    hits: list[tuple[int, str, bool]] = []
    for i, arg in enumerate(args):
        if not arg.startswith("-") or arg in {"-", "--"}:
            continue  # a value, not a flag
        written = arg.split("=", 1)[0]
        name = _norm(written)
        if name in owned:
            hits.append((i, written if written in flags else owned[name], False))
            continue
        if name.startswith("--") and len(name) > 3:
            expanded = sorted(n for n in long_owned if n.startswith(name))
            if expanded:
                hits.append((i, owned[expanded[0]], True))
    return hits


def _engine_reason(adapter: EngineAdapter, flag: str, args: Sequence[str], i: int) -> str:
    """The adapter's own reason for refusing ``flag`` (its parser explains forbidden flags), if any."""
    tokens = [args[i]]
    if "=" not in args[i] and i + 1 < len(args) and not args[i + 1].startswith("-"):
        tokens.append(args[i + 1])
    argv = adapter.render("model", adapter.default_config()).argv
    try:
        adapter.parse([*argv, *tokens])
    except ValueError as exc:  # ArgsError
        text = str(exc)
        head = f"argument {tokens[0].split('=', 1)[0]}: "
        if text.startswith(head):
            return text[len(head) :]
    except Exception:  # the reason is a nicety; never let it break validation
        return ""
    return ""


def _check_extra_args(
    adapter: EngineAdapter, args: Sequence[str], model: str, tensor_parallel: int
) -> list[Problem]:
    problems: list[Problem] = []
    for i, flag, abbreviated in owned_flag_hits(adapter, args):
        how = f"abbreviates {flag}" if abbreviated else f"sets {flag}"
        reason = "" if abbreviated else _engine_reason(adapter, flag, args, i)
        why = f" ({reason})" if reason and "expected" not in reason else ""
        owner = f"a flag the operator owns on {adapter.name}{why}"
        problems.append((f"extraArgs[{i}]", f"{args[i]!r} {how}, {owner}; {_instead(adapter, flag)}"))
    problems += _control_characters(args)
    if not problems and args:
        problems += _engine_refusals(adapter, args, model, tensor_parallel)
    return problems


def _control_characters(args: Sequence[str]) -> list[Problem]:
    """Control characters (NUL, tab, escape, ...) and invisible format characters (zero-width spaces,
    bidi overrides): an argv cannot carry NUL, and the others make a flag read as something else."""
    problems: list[Problem] = []
    for i, arg in enumerate(args):
        bad = sorted({c for c in arg if unicodedata.category(c) in _CONTROL_CATEGORIES})
        if bad:
            shown = ", ".join(f"U+{ord(c):04X}" for c in bad)
            problems.append(
                (
                    f"extraArgs[{i}]",
                    f"contains control or invisible character(s) {shown}; allowed: printable characters "
                    "only (one flag or value per list item)",
                )
            )
    return problems


def _engine_refusals(
    adapter: EngineAdapter, args: Sequence[str], model: str, tensor_parallel: int
) -> list[Problem]:
    """What the engine's own parser would refuse in ``args`` (unknown flags, bad values, stray
    positionals): the operator renders exactly this command, so refuse it here, not at rollout."""
    try:
        adapter.render(model, adapter.default_config(), args, None, tensor_parallel)
    except ValueError as exc:  # ArgsError
        text = str(exc)
        index = _refused_index(adapter, text, args, model, tensor_parallel)
        path = f"extraArgs[{index}]" if index is not None else "extraArgs"
        shown = f"{args[index]!r} " if index is not None else ""
        hint = (
            f"; allowed: {adapter.name} flags prefixtune knows, each followed by its value "
            f"(check one with: prefixtune args --engine {adapter.name} --model M -- FLAG VALUE)"
            if text.startswith("unrecognized arguments")
            else ""
        )
        return [(path, f"{shown}is refused by {adapter.name}'s command line: {text}{hint}")]
    return []


def _refused_index(
    adapter: EngineAdapter, text: str, args: Sequence[str], model: str, tensor_parallel: int
) -> int | None:
    """The item of ``args`` an ArgsError message is about ("argument --x: ...", "unrecognized
    arguments: --y 3"), or None when it names none. A flag given twice: the occurrence that fails."""
    match = re.match(r"^argument (\S+?):", text)
    token = match.group(1) if match else None
    if token is None and text.startswith("unrecognized arguments: "):
        rest = text[len("unrecognized arguments: ") :]
        token = next((a for a in args if a and rest.startswith(a)), None)
    if token is None:
        return None
    found = [i for i, arg in enumerate(args) if arg == token or arg.startswith(token + "=")]
    for i in found:
        alone = [args[i]]
        if "=" not in args[i] and i + 1 < len(args) and not looks_like_flag(args[i + 1]):
            alone.append(args[i + 1])
        try:
            adapter.render(model, adapter.default_config(), alone, None, tensor_parallel)
        except ValueError:
            return i
    return found[0] if found else None


def _check_routing(spec: ServingDeploymentSpec) -> list[Problem]:
    """A policy the resource's router lacks (spec.routing.router, else the engine's), in
    spec.routing.policy or spec.tuning.space.routingPolicy, is refused with those it has."""
    router = spec.routing.router or ENGINE_ROUTER[spec.engine]
    problems: list[Problem] = []
    if spec.routing.policy != AUTO_POLICY:
        problem = policy_problem(RoutingPolicy(spec.routing.policy), router)
        if problem is not None:
            problems.append(("routing.policy", problem))
        elif spec.adopt is not None and spec.routing.policy != RoutingPolicy.KUBE_PROXY:
            problems.append(
                (
                    "routing.policy",
                    "an adopting resource gets no router (the adopted Deployment's pods are its team's); "
                    "allowed with spec.adopt: auto or kube-proxy",
                )
            )
    listed = spec.tuning.space.listed().get(ROUTING_POLICY) or []
    for i, value in enumerate(listed):
        if value in {p.value for p in RoutingPolicy}:
            problem = policy_problem(RoutingPolicy(value), router)
            if problem is not None:
                problems.append((f"tuning.space.{knob_field(ROUTING_POLICY)}[{i}]", problem))
    return problems


def _check_rollout(spec: ServingDeploymentSpec) -> list[Problem]:
    if spec.tuning.rollout.strategy is RolloutStrategy.CANARY and spec.replicas < 2:
        return [
            (
                "tuning.rollout.strategy",
                f"canary needs spec.replicas >= 2 (the canary runs beside a baseline replica), got "
                f"replicas {spec.replicas}; allowed with 1 replica: rolling",
            )
        ]
    return []


def _check_adopt(spec: ServingDeploymentSpec) -> list[Problem]:
    """An adopted Deployment is left as it is when the resource goes (no ownerReference): it must
    never run a trial's config, so trials run beside it, on the operator's canary Deployment."""
    if spec.adopt is None or spec.tuning.mode != TuningMode.AUTO:
        return []
    rollout = spec.tuning.rollout
    strategy = rollout.strategy or (RolloutStrategy.CANARY if spec.replicas >= 2 else RolloutStrategy.ROLLING)
    beside = strategy is RolloutStrategy.CANARY or (
        rollout.max_trial_replicas is not None and rollout.max_trial_replicas < spec.replicas
    )
    if beside:
        return []
    return [
        (
            "tuning.rollout",
            "adopt: trials must run beside the adopted Deployment (it keeps its config when the resource "
            "is deleted): use replicas >= 2 with strategy canary, or rolling with maxTrialReplicas below "
            f"replicas (got {strategy} with replicas {spec.replicas}); or tuning.mode observe",
        )
    ]


def _check_secret_ref(spec: ServingDeploymentSpec) -> list[Problem]:
    if spec.api_key_secret is not None and str(spec.engine) not in API_KEY_ENGINES:
        return [
            (
                "apiKeySecret",
                f"{spec.engine} takes no API key (supported: {', '.join(sorted(API_KEY_ENGINES))})",
            )
        ]
    return []


def _check_metrics(spec: ServingDeploymentSpec) -> list[Problem]:
    """A spec's metrics.url is optional: the operator's own Prometheus is the default (a URL the
    admin did not allow is refused by the operator, ``controller/admin.py``). It may carry no
    credentials, query string or fragment (the operator appends the API path and the query)."""
    url = spec.tuning.metrics.url
    if url is None:
        return []
    parts = urlsplit(url)
    if parts.username or parts.password or parts.query or parts.fragment:
        return [
            (
                "tuning.metrics.url",
                "a Prometheus base URL has no user:password@, ?query or #fragment, e.g. "
                "http://prometheus.monitoring:9090",
            )
        ]
    return []
