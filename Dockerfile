# syntax=docker/dockerfile:1.7
# ckpt-sidecar container image. Build from the repository root:
#
#   docker build -t ckpt-sidecar:0.1.0 .
#
# * Runs as the numeric non-root user 10001:10001 (Kubernetes `runAsNonRoot` can check it).
# * Works with a read-only root file system: the only paths it writes are the watched folder
#   (/checkpoints, which also holds the state cache `.ckpt-sidecar-state` and restore's temporary
#   folder) and /tmp; both are declared volumes. HOME is /tmp for libraries that want one.
# * `docker stop` waits 10 s by default, less than a drain needs: run with `--stop-timeout 120`
#   (and `shutdown_grace_seconds` below it). See deploy/README.md.
# * Dependencies are pinned by the constraints below (every package the install resolves;
#   tests/deploy/test_wheel.py fails when one is missing). Regenerate after changing
#   pyproject.toml with:
#     pip install --dry-run --ignore-installed --report report.json '.[azure-identity]'
#   and copy every "name==version" of report.json's "install" list (except ckpt-sidecar) below.

ARG PYTHON_IMAGE=python:3.11-slim-bookworm

# ---------------------------------------------------------------------------------------------
FROM ${PYTHON_IMAGE} AS build

ENV PIP_NO_CACHE_DIR=1 \
    PIP_DISABLE_PIP_VERSION_CHECK=1 \
    PIP_ROOT_USER_ACTION=ignore \
    PYTHONDONTWRITEBYTECODE=1

COPY <<'EOF' /constraints.txt
# build tools
setuptools==84.2.1
wheel==0.48.0
# runtime: ckpt-sidecar[azure-identity] resolved for CPython 3.11 on Linux
annotated-types==0.8.0
awscrt==0.38.0
azure-core==1.41.0
azure-identity==1.27.0
azure-storage-blob==12.31.1
boto3==1.44.8
botocore==1.44.8
certifi==2026.10.19.post1
cffi==2.1.1
charset-normalizer==3.5.3
cryptography==50.0.2
google-api-core==2.44.0
google-auth==2.63.0
google-cloud-core==2.8.0
google-cloud-storage==3.17.1
google-crc32c==1.9.0
google-resumable-media==2.11.0
googleapis-common-protos==1.76.0
idna==3.20
isodate==0.7.2
jmespath==1.1.0
markdown-it-py==4.3.0
mdurl==0.1.2
msal==1.39.0
msal-extensions==1.3.1
opentelemetry-api==1.45.2
prometheus-client==0.26.0
proto-plus==1.29.0
protobuf==7.36.2
pyasn1==0.6.5
pyasn1-modules==0.4.2
pycparser==3.12
pydantic==2.14.4
pydantic-core==2.50.5
pygments==2.21.0
pyjwt==2.15.1
python-dateutil==2.9.0.post0
pyyaml==6.0.4
requests==2.34.2
rich==15.0.0
s3transfer==0.19.3
six==1.17.0
structlog==26.1.0
typing-inspection==0.4.5
typing-extensions==4.16.0
urllib3==2.8.0
watchdog==7.1.1
EOF

# The wheel is built in a throw-away venv with pinned build tools (no build isolation, so no
# unpinned download); the runtime venv gets only the wheel and its pinned dependencies.
WORKDIR /src
COPY pyproject.toml README.md ./
COPY sidecar/ sidecar/
RUN python -m venv /opt/build \
    && /opt/build/bin/pip install --constraint /constraints.txt setuptools wheel \
    && /opt/build/bin/pip wheel --no-deps --no-build-isolation --wheel-dir /wheels .

# azure-identity: workload identity and managed identity on Azure
# (destination.azure.use_default_credential). Not `crt`: the S3 uploads are our own multipart over
# botocore, never the AWS CRT transfer client (measured, not adopted: bench/s3.md), and awscrt,
# which computes the CRC32C, is already a base dependency; the extra would add nothing.
ARG EXTRAS=azure-identity
RUN python -m venv /opt/ckpt-sidecar \
    && /opt/ckpt-sidecar/bin/pip install --constraint /constraints.txt \
        "$(find /wheels -name 'ckpt_sidecar-*.whl')[${EXTRAS}]" \
    && /opt/ckpt-sidecar/bin/pip check \
    && /opt/ckpt-sidecar/bin/ckpt-sidecar --help > /dev/null

# ---------------------------------------------------------------------------------------------
FROM ${PYTHON_IMAGE}

ARG VERSION=0.1.0
LABEL org.opencontainers.image.title="ckpt-sidecar" \
      org.opencontainers.image.description="Keeps deep-learning checkpoints safe on interruptible GPUs: watch, upload, commit, flush before preemption, restore." \
      org.opencontainers.image.version="${VERSION}" \
      org.opencontainers.image.licenses="Apache-2.0" \
      org.opencontainers.image.base.name="docker.io/library/python:3.11-slim-bookworm"

RUN groupadd --system --gid 10001 ckpt \
    && useradd --system --uid 10001 --gid 10001 --no-create-home --home-dir /tmp \
        --shell /usr/sbin/nologin ckpt \
    && mkdir -p /checkpoints \
    && chown 10001:10001 /checkpoints

COPY --from=build /opt/ckpt-sidecar /opt/ckpt-sidecar

# The admin listener binds all interfaces inside the container so that probes, `docker run -p`
# and Prometheus reach it; POST /v1/flush and /v1/drain still need loopback or the bearer token.
ENV PATH=/opt/ckpt-sidecar/bin:$PATH \
    HOME=/tmp \
    PYTHONUNBUFFERED=1 \
    PYTHONDONTWRITEBYTECODE=1 \
    CKPT_SIDECAR_WATCH__PATH=/checkpoints \
    CKPT_SIDECAR_ADMIN__HOST=0.0.0.0 \
    CKPT_SIDECAR_ADMIN__PORT=9477 \
    CKPT_SIDECAR_LOG__FORMAT=json

USER 10001:10001
WORKDIR /checkpoints
VOLUME ["/checkpoints", "/tmp"]
EXPOSE 9477

# SIGTERM drains (uploads the newest complete checkpoint) and exits within
# shutdown_grace_seconds; SIGUSR1 drains without exiting. The health check asks the port the
# daemon listens on: CKPT_SIDECAR_ADMIN__PORT when `docker run -e` changes it, else 9477 (Python,
# not curl: the slim base image has none).
STOPSIGNAL SIGTERM
HEALTHCHECK --interval=30s --timeout=5s --start-period=20s --retries=3 \
    CMD ["python", "-c", "import os, urllib.request; urllib.request.urlopen('http://127.0.0.1:%s/healthz' % (os.environ.get('CKPT_SIDECAR_ADMIN__PORT') or '9477'), timeout=4)"]

ENTRYPOINT ["ckpt-sidecar"]
CMD ["run"]
