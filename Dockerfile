# The prefixtune operator image: `prefixtune run` on a slim Python, as a non-root user, on a read-only
# root filesystem (the Helm chart mounts an emptyDir at /tmp, the only writable path).
#
#   docker build -t ghcr.io/prefixtune/prefixtune:0.1.0 .

# Reproducible (issue #17): the base image is pinned by digest and every Python dependency by version.
# The digest is the multi-platform index of python:3.11.13-slim-bookworm as pinned in several public
# repositories' Dockerfiles; it was not re-read from Docker Hub here (no registry access). To move it:
#   docker buildx imagetools inspect python:3.11.13-slim-bookworm   # the "Digest:" line
# The versions are constraints.txt, generated from the tested environment by scripts/lock_constraints.py.
ARG PYTHON_IMAGE=python:3.11.13-slim-bookworm@sha256:86adf8dbadc3d6e82ee5dd2c74bec2e1c2467cdad47886280501df722372d2e1

# --- build: a wheel of this project, installed with its runtime dependencies into a virtualenv ---
FROM ${PYTHON_IMAGE} AS build

ENV PIP_NO_CACHE_DIR=1 \
    PIP_DISABLE_PIP_VERSION_CHECK=1 \
    PYTHONDONTWRITEBYTECODE=1

WORKDIR /src
# setup.py (the twin's optional C block pool) stays out: the operator never runs the twin, so the
# wheel stays pure Python and the image needs no compiler.
COPY pyproject.toml README.md constraints.txt ./
COPY operator/ operator/

# The runtime dependencies come from the wheel's metadata (pyproject.toml); no test or sandbox extras.
# pip compiles the .pyc files at install time, so nothing is written at run time.
RUN python -m pip wheel --no-deps --wheel-dir /wheels . \
    && python -m venv /opt/prefixtune \
    && /opt/prefixtune/bin/pip install --constraint constraints.txt /wheels/prefixtune-0.1.0-py3-none-any.whl \
    && /opt/prefixtune/bin/pip uninstall --yes pip \
    && /opt/prefixtune/bin/prefixtune run --help > /dev/null

# --- runtime ---
FROM ${PYTHON_IMAGE}

LABEL org.opencontainers.image.title="prefixtune" \
      org.opencontainers.image.description="Kubernetes operator that tunes LLM serving engines' prefix caching" \
      org.opencontainers.image.licenses="Apache-2.0" \
      org.opencontainers.image.version="0.1.0"

# A named user for uid 65532 (the chart's runAsUser), without a home or a login shell.
RUN groupadd --gid 65532 prefixtune \
    && useradd --uid 65532 --gid 65532 --no-create-home --home-dir /tmp --shell /usr/sbin/nologin prefixtune

COPY --from=build /opt/prefixtune /opt/prefixtune

ENV PATH=/opt/prefixtune/bin:$PATH \
    PYTHONDONTWRITEBYTECODE=1 \
    PYTHONUNBUFFERED=1 \
    HOME=/tmp \
    TMPDIR=/tmp

USER 65532:65532
WORKDIR /tmp
EXPOSE 8080
ENTRYPOINT ["prefixtune", "run"]
