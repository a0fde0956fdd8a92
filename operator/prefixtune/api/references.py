"""Container image references and model names: what a valid one looks like, and the admin's image
policy.

Image references follow the grammar of the distribution project's ``reference`` package
(github.com/distribution/reference, regexp.go): ``[domain[:port]/]path[:tag][@digest]`` with
lower-case path components, a tag of at most 128 word characters, and a digest
``algorithm:hex``; the whole name at most 255 characters. Anything else (spaces, upper case in the
path, a shell fragment, control characters) is not an image the kubelet could pull, so it is refused
at validation instead of producing a pod stuck in ``InvalidImageName``.

The image policy (``prefixtune run --allowed-images``, the chart's ``enginePolicy.allowedImages``) is
a list of registries/repositories: an image is allowed when its repository is one of them or lies
under one (``ghcr.io/acme/`` allows ``ghcr.io/acme/vllm:1``). Docker Hub short names are normalised
(``vllm/vllm-openai`` is ``docker.io/vllm/vllm-openai``). The default is the engines' own repositories.
"""

from __future__ import annotations

import re
import unicodedata
from collections.abc import Iterable, Sequence

_ALNUM = r"[a-z0-9]+"
_SEPARATOR = r"(?:[._]|__|[-]+)"
_PATH_COMPONENT = rf"{_ALNUM}(?:{_SEPARATOR}{_ALNUM})*"
_DOMAIN_COMPONENT = r"(?:[a-zA-Z0-9]|[a-zA-Z0-9][a-zA-Z0-9-]*[a-zA-Z0-9])"
_DOMAIN = rf"(?:{_DOMAIN_COMPONENT}(?:\.{_DOMAIN_COMPONENT})*|\[[a-fA-F0-9:]+\])(?::[0-9]+)?"
_TAG = r"[A-Za-z0-9_][A-Za-z0-9_.-]{0,127}"
_DIGEST = r"[A-Za-z][A-Za-z0-9]*(?:[-_+.][A-Za-z][A-Za-z0-9]*)*:[0-9a-fA-F]{32,}"
_NAME = rf"(?:{_DOMAIN}/)?{_PATH_COMPONENT}(?:/{_PATH_COMPONENT})*"
IMAGE_PATTERN = rf"^{_NAME}(?::{_TAG})?(?:@{_DIGEST})?$"
_IMAGE = re.compile(IMAGE_PATTERN)
MAX_IMAGE_NAME = 255

# Control characters (C0, DEL, C1) and the invisible format characters most used to disguise text
# (zero-width, bidirectional overrides, word joiners, BOM), for the CRD's pattern; the Python check
# refuses every Unicode control/format/private/surrogate/separator character.
_INVISIBLE = "\\u0000-\\u001f\\u007f-\\u009f\\u00ad\\u200b-\\u200f\\u202a-\\u202e\\u2060-\\u2064\\ufeff"
MODEL_PATTERN = rf"^[^\s{_INVISIBLE}-][^\s{_INVISIBLE}]*$"
_REFUSED_CATEGORIES = {"Cc", "Cf", "Co", "Cs", "Cn", "Zl", "Zp", "Zs"}


def image_problem(image: str) -> str | None:
    """Why ``image`` is not a valid image reference (None when it is)."""
    name = image.split("@", 1)[0]
    if ":" in name.rsplit("/", 1)[-1]:
        name = name.rsplit(":", 1)[0]
    if len(name) > MAX_IMAGE_NAME:
        return f"the image name is {len(name)} characters; at most {MAX_IMAGE_NAME}"
    if not _IMAGE.fullmatch(image):  # fullmatch: '$' alone lets a trailing newline through
        return (
            f"{_shown(image)} is not a valid image reference: [registry[:port]/]repository[:tag][@digest], "
            "lower-case repository, e.g. vllm/vllm-openai:v0.9.0"
        )
    return None


def model_problem(name: str) -> str | None:
    """Why ``name`` cannot be a model name or path (None when it can)."""
    if not name.strip():
        return "must not be empty; give a model name or path, e.g. meta-llama/Llama-3.1-8B-Instruct"
    bad = sorted({f"U+{ord(c):04X}" for c in name if unicodedata.category(c) in _REFUSED_CATEGORIES})
    if bad:
        return (
            f"contains control, invisible or space characters ({', '.join(bad)}); a model name or path "
            "is printable text, e.g. meta-llama/Llama-3.1-8B-Instruct"
        )
    if name.startswith("-"):
        return f"{name!r} is not a model name or path: it may not start with '-'"
    return None


def _shown(text: str) -> str:
    """A value quoted for a message with its control characters escaped (no terminal escapes)."""
    return ascii(text) if any(unicodedata.category(c)[0] == "C" for c in text) else repr(text)


def repository(image: str) -> str:
    """The normalised repository of an image reference (no tag or digest, docker.io made explicit)."""
    name = image.split("@", 1)[0]
    last = name.rsplit("/", 1)
    if ":" in last[-1]:
        name = name.rsplit(":", 1)[0]
    first, _, rest = name.partition("/")
    if not rest:
        return f"docker.io/library/{first}"
    if "." not in first and ":" not in first and first != "localhost":
        return f"docker.io/{name}"
    return name


def _normalise_entry(entry: str) -> str:
    entry = entry.strip()
    under = entry.endswith("/")
    repo = repository(entry.rstrip("/")) if entry.rstrip("/") else ""
    if under and "/" not in entry.rstrip("/"):
        repo = entry.rstrip("/")  # a bare registry: "ghcr.io/"
    return repo + ("/" if under else "")


def image_allowed(image: str, allowed: Iterable[str]) -> bool:
    repo = repository(image)
    for entry in allowed:
        want = _normalise_entry(entry)
        if not want:
            continue
        if want.endswith("/") and repo.startswith(want):
            return True
        if repo == want or repo.startswith(want + "/"):
            return True
    return False


def policy_problem(image: str, allowed: Sequence[str]) -> str | None:
    """Why the operator's image policy refuses ``image`` (None: allowed)."""
    if image_allowed(image, allowed):
        return None
    return (
        f"{image!r} is not allowed by the operator's image policy (allowed repositories: "
        f"{', '.join(allowed) or 'none'}); ask the cluster admin to add it (--allowed-images)"
    )
