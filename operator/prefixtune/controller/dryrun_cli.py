"""``prefixtune render``: print the objects the operator would create for ServingDeployments.

    prefixtune render -f examples/vllm-rag.yaml
    cat sdep.yaml | prefixtune render -f - --output json
    prefixtune render -f a.yaml -f b.yaml --service-monitor --prometheus-url http://prometheus:9090

Every document of a file is read (YAML 1.1, as kubectl reads it); each ServingDeployment is checked
and rendered by ``dryrun.render_objects``; documents of other API groups are skipped with a note.
The objects go to stdout (YAML documents, or one JSON ``List``); the operator's messages for an
invalid document go to stderr, and nothing of that document is printed. Exit 0: all rendered; 1:
some input is invalid (a document, unparsable YAML, no ServingDeployment at all); 2: usage.
"""

from __future__ import annotations

import argparse
import json
import sys
from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import IO, Any

import yaml

from prefixtune.api.models import API_GROUP
from prefixtune.controller.admin import AdminPolicy, add_spec_policy_arguments, spec_policy_from_args
from prefixtune.controller.dryrun import is_serving_deployment, render_notes, render_objects

PROG = "prefixtune render"
MAX_INPUT_BYTES = 8 * 1024 * 1024  # per file: far more than any set of manifests


class UsageError(ValueError):
    """A bad flag or an input that cannot be opened; exit 2."""


def _parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(
        prog=PROG,
        description="Print the Deployment, Service and ConfigMap (where the engine reads one) that the "
        "operator would create for each ServingDeployment's starting config, with the operator's "
        "validation messages for an invalid one.",
        epilog="The admin's policy (allowed images, Prometheus) is the cluster's: it is checked only "
        "when one of its flags is given, as `prefixtune run` takes them.",
    )
    p.add_argument(
        "-f",
        "--filename",
        action="append",
        required=True,
        metavar="FILE",
        help="a YAML or JSON file of one or more documents; '-' reads stdin (repeatable)",
    )
    p.add_argument("-o", "--output", choices=("yaml", "json"), default="yaml", help="output format")
    p.add_argument(
        "--service-monitor",
        action="store_true",
        help="also the ServiceMonitor (the operator creates one where prometheus-operator is installed)",
    )
    add_spec_policy_arguments(p)
    return p


def _policy(args: argparse.Namespace) -> AdminPolicy | None:
    given = (
        args.allowed_images
        or args.prometheus_url is not None
        or args.prometheus_allowed_hosts
        or args.allow_host_path_volumes
        or args.router_image
        or args.no_auto_routing
    )
    if not given:
        return None
    try:
        return spec_policy_from_args(args)
    except ValueError as err:
        raise UsageError(str(err)) from None


def _read(name: str, stdin: IO[str]) -> str:
    """The text of one input, at most MAX_INPUT_BYTES; raises UsageError when it cannot be read,
    ValueError when it is too large."""
    if name == "-":
        text = stdin.read(MAX_INPUT_BYTES + 1)
    else:
        path = Path(name)
        if path.is_dir():
            raise UsageError(f"{name}: is a directory; name its files (-f {name.rstrip('/')}/x.yaml)")
        try:
            with path.open(encoding="utf-8") as handle:
                text = handle.read(MAX_INPUT_BYTES + 1)
        except (OSError, UnicodeDecodeError) as err:
            raise UsageError(f"{name}: cannot read it: {getattr(err, 'strerror', None) or err}") from None
    if len(text) > MAX_INPUT_BYTES:
        raise ValueError(f"more than {MAX_INPUT_BYTES} characters; split it")
    return text


def _label(doc: object, index: int) -> str:
    """``document 2 (ServingDeployment default/rag)``: which document a message is about."""
    fields = doc if isinstance(doc, Mapping) else {}
    meta = fields.get("metadata")
    meta = meta if isinstance(meta, Mapping) else {}
    kind = fields.get("kind") or "object"
    name = meta.get("name")
    # A ServingDeployment without a namespace lands in "default"; other kinds may be cluster-scoped.
    ns = meta.get("namespace") or ("default" if is_serving_deployment(doc) else None)
    what = f"{kind} {f'{ns}/' if ns else ''}{name}" if name else str(kind)
    return f"document {index} ({what})"


class _Dumper(yaml.SafeDumper):
    """Multi-line strings (TensorRT-LLM's options file in the ConfigMap) as literal blocks."""


def _string(dumper: yaml.SafeDumper, value: str) -> yaml.Node:
    style = "|" if "\n" in value else None
    return dumper.represent_scalar("tag:yaml.org,2002:str", value, style=style)


_Dumper.add_representer(str, _string)


def _dump(objects: list[dict[str, Any]], output: str) -> str:
    """YAML documents in the order the operator applies them, or one JSON List (as kubectl -o json)."""
    if output == "json":
        return json.dumps({"apiVersion": "v1", "kind": "List", "items": objects}, indent=2) + "\n"
    return "".join(
        "---\n" + yaml.dump(o, Dumper=_Dumper, sort_keys=False, default_flow_style=False, width=100)
        for o in objects
    )


def run(argv: Sequence[str], stdin: IO[str], stdout: IO[str], stderr: IO[str]) -> int:
    try:
        args = _parser().parse_args(list(argv))
    except SystemExit as exc:  # argparse printed the usage error (2) or the help (0)
        return int(exc.code or 0)
    try:
        policy = _policy(args)
        sources = [(name, _read(name, stdin)) for name in args.filename]
    except UsageError as err:
        print(f"{PROG}: {err}", file=stderr)
        return 2
    except ValueError as err:
        print(f"{PROG}: {err}", file=stderr)
        return 1
    objects: list[dict[str, Any]] = []
    failed = False
    rendered = 0
    for name, text in sources:
        try:
            docs = list(yaml.safe_load_all(text))
        except yaml.YAMLError as err:
            print(f"{PROG}: {name}: not valid YAML: {err}", file=stderr)
            failed = True
            continue
        for index, doc in enumerate(docs, start=1):
            if doc is None:
                continue  # an empty document (a trailing ---)
            found, problems = render_objects(doc, policy, monitoring=args.service_monitor)
            where = f"{name}: {_label(doc, index)}"
            for problem in problems:
                print(f"{where}: {problem}", file=stderr)
            if problems:
                failed = True
            elif not is_serving_deployment(doc):
                print(f"{where}: skipped (not a {API_GROUP} resource)", file=stderr)
            else:
                rendered += 1
                objects += found
                for note in render_notes(doc):
                    print(f"{where}: note: {note}", file=stderr)
    if rendered == 0 and not failed:
        print(f"{PROG}: no ServingDeployment in the input", file=stderr)
        failed = True
    if objects:
        stdout.write(_dump(objects, args.output))
    return 1 if failed else 0


def main(argv: Sequence[str] | None = None) -> int:
    return run(list(sys.argv[1:] if argv is None else argv), sys.stdin, sys.stdout, sys.stderr)
