# syntax=docker/dockerfile:1
# The `ductor` image. The processor (`ductor process`), the step worker (`ductor worker`) and
# the web page (`ductor ui`) are subcommands of one program, so this one image runs every
# component of infra/k8s.
#
#   docker build -t ductor:0.1.0 .
#   docker run --rm ductor:0.1.0 --help
#
# Your step functions go into an image built from this one, e.g.
#
#   FROM ductor:0.1.0
#   COPY my_steps/ /app/my_steps/
#
# and the worker runs them with `ductor worker --app my_steps:registry` (the working
# directory, /app, is importable: docs/operations/deployment.md#deploying-on-kubernetes).

# The Python CI tests with (pyproject.toml: requires-python >= 3.11). Pin a digest in production.
ARG PYTHON_IMAGE=python:3.11-slim-bookworm

# --- build: the project's wheel, installed with its runtime dependencies (no dev extra) into a
# virtualenv that the runtime stage copies whole. Nothing of the build is left in the image.
FROM ${PYTHON_IMAGE} AS build
ENV PIP_NO_CACHE_DIR=1 PIP_DISABLE_PIP_VERSION_CHECK=1
# A C compiler: setup.py compiles the hot paths with mypyc (without one the wheel is pure
# Python). The runtime stage needs none.
RUN apt-get update \
    && apt-get install -y --no-install-recommends gcc libc6-dev \
    && rm -rf /var/lib/apt/lists/*
WORKDIR /src
# What the wheel is built from (.dockerignore sends nothing else); schemas/ holds the SQL
# migrations and JSON schemas that `ductor migrate` and `ductor workflows register` read.
COPY pyproject.toml README.md setup.py ./
COPY schemas/ schemas/
COPY processor/ processor/
RUN python -m pip wheel --no-deps --wheel-dir /dist .
# The wheel (its one file) with two extras: `binary`, psycopg's build that brings its own
# libpq, which this slim base and the runtime stage lack (without it every command, --help
# included, ends in "ImportError: no pq wrapper available"); and `ui`, for `ductor ui` (the
# web page's Deployment in infra/k8s). tests/integration/test_wheel.py runs this very
# instruction into a clean virtualenv and runs what it installed against the services.
RUN python -m venv /opt/ductor \
    && /opt/ductor/bin/pip install "$(echo /dist/*.whl)[binary,ui]"

# --- runtime
FROM ${PYTHON_IMAGE}
# tini as PID 1: it forwards SIGTERM to `ductor` (which stops gracefully within
# DUCTOR_SHUTDOWN_TIMEOUT_S) and reaps orphans, e.g. of step functions that start processes.
# Signals go to `ductor` only, not its process group: the worker stops its own child processes.
RUN apt-get update \
    && apt-get install -y --no-install-recommends ca-certificates tini \
    && rm -rf /var/lib/apt/lists/*
RUN groupadd --system --gid 10001 ductor \
    && useradd --system --uid 10001 --gid ductor --no-create-home --home-dir /nonexistent \
        --shell /usr/sbin/nologin ductor
COPY --from=build /opt/ductor /opt/ductor
# PSYCOPG_IMPL=binary: psycopg loads its binary build or fails at once, never a libpq of the
# system that an image built FROM this one may have added.
ENV PATH=/opt/ductor/bin:$PATH \
    PSYCOPG_IMPL=binary \
    PYTHONUNBUFFERED=1 \
    PYTHONDONTWRITEBYTECODE=1
WORKDIR /app
# Numeric, so that Kubernetes can check runAsNonRoot without reading /etc/passwd.
USER 10001:10001
# No HEALTHCHECK: the health port is off unless DUCTOR_HEALTH_PORT is set, and Kubernetes
# ignores HEALTHCHECK anyway (infra/k8s probes /healthz and /readyz).
ENTRYPOINT ["/usr/bin/tini", "--", "ductor"]
CMD ["process"]
