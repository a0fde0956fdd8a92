# The prefixtune operator image: `prefixtune run` on a slim Python, as a non-root user, on a read-only
# root filesystem (the Helm chart mounts an emptyDir at /tmp, the only writable path).
#
#   docker build -t ghcr.io/prefixtune/prefixtune:0.1.0 .

# --- build: a wheel of this project, installed with its runtime dependencies into a virtualenv ---
FROM python:3.11.13-slim-bookworm AS build

ENV PIP_NO_CACHE_DIR=1 \
    PIP_DISABLE_PIP_VERSION_CHECK=1 \
    PYTHONDONTWRITEBYTECODE=1

WORKDIR /src
# setup.py (the twin's optional C block pool) stays out: the operator never runs the twin, so the
# wheel stays pure Python and the image needs no compiler.
COPY pyproject.toml README.md ./
COPY operator/ operator/

# The runtime dependencies come from the wheel's metadata (pyproject.toml); no test or sandbox extras.
# pip compiles the .pyc files at install time, so nothing is written at run time.
RUN python -m pip wheel --no-deps --wheel-dir /wheels . \
    && python -m venv /opt/prefixtune \
    && /opt/prefixtune/bin/pip install /wheels/prefixtune-0.1.0-py3-none-any.whl \
    && /opt/prefixtune/bin/pip uninstall --yes pip \
    && /opt/prefixtune/bin/prefixtune run --help > /dev/null

# --- runtime ---
FROM python:3.11.13-slim-bookworm

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
