# syntax=docker/dockerfile:1
# genhook's container images (docs/deploy.md). One image runs every role:
#   docker run IMAGE api | worker | dispatcher | db upgrade | serve | accounts ...
# Targets:
#   cpu  (default)  the built-in models (image edit, video, voices, speech-to-text, style
#                   transfer): everything they need ships in the Python wheels; no torch.
#   cuda            cpu plus the local-model engine (diffusers) on PyTorch built for CUDA:
#                   docker build --target cuda . ; pins torch ${TORCH_VERSION} from the
#                   PyTorch index for ${TORCH_CUDA} (CUDA 12.8: an NVIDIA driver of 570 or newer
#                   on the node). The CUDA runtime comes in torch's wheels, so the base stays
#                   Debian and the card's driver is the only thing the host provides.
# Data (/var/lib/genhook) and local model weights (/models) are volumes: nothing is downloaded
# at run time (HF_HUB_OFFLINE), and the image holds no state.
ARG BASE_IMAGE=debian:bookworm-slim

FROM ${BASE_IMAGE} AS runtime-base
ENV DEBIAN_FRONTEND=noninteractive
RUN apt-get update \
    && apt-get install -y --no-install-recommends python3 ca-certificates libgomp1 \
    && rm -rf /var/lib/apt/lists/* /var/cache/apt/*

# The build stage: a virtual environment filled from wheels; its pip and any build tools stay here.
FROM runtime-base AS build
RUN apt-get update \
    && apt-get install -y --no-install-recommends python3-venv \
    && rm -rf /var/lib/apt/lists/*
RUN python3 -m venv /opt/genhook
ENV PIP_DISABLE_PIP_VERSION_CHECK=1 PIP_DEFAULT_TIMEOUT=120
# A network whose TLS is inspected gives its CA bundle as a build secret:
#   docker build --secret id=ca-bundle,src=/etc/ssl/certs/ca-certificates.crt .
# Without it pip trusts the image's own CA certificates. The bundle never enters a layer.
RUN printf '%s\n' '#!/bin/sh' \
        'if [ -s /run/secrets/ca-bundle ]; then export PIP_CERT=/run/secrets/ca-bundle; fi' \
        'exec /opt/genhook/bin/pip install "$@"' > /usr/local/bin/pip-install \
    && chmod 0755 /usr/local/bin/pip-install
# The dependencies first, from pyproject.toml alone (a layer that survives source edits),
# then the package itself from a clean copy.
COPY pyproject.toml /deps/
RUN --mount=type=cache,target=/root/.cache/pip --mount=type=secret,id=ca-bundle \
    mkdir -p /deps/src/genhook && touch /deps/README.md /deps/src/genhook/__init__.py \
    && pip-install --prefer-binary '/deps[server]' \
    && /opt/genhook/bin/pip uninstall -y genhook && rm -rf /deps
COPY pyproject.toml README.md /src/
COPY src /src/src
RUN --mount=type=cache,target=/root/.cache/pip --mount=type=secret,id=ca-bundle \
    pip-install --no-deps /src \
    && rm -rf /src

FROM build AS build-cuda
ARG TORCH_VERSION=2.13.0
ARG TORCH_CUDA=cu128
RUN --mount=type=cache,target=/root/.cache/pip --mount=type=secret,id=ca-bundle \
    pip-install --prefer-binary \
        --extra-index-url "https://download.pytorch.org/whl/${TORCH_CUDA}" \
        "torch==${TORCH_VERSION}" "diffusers>=0.35" "transformers>=4.51" "accelerate>=1.0" \
        "safetensors>=0.4"

# The final stages: Python and the environment, no compilers, no pip cache, a user of its own.
FROM runtime-base AS cpu
RUN groupadd --system --gid 10001 genhook \
    && useradd --system --uid 10001 --gid genhook --home-dir /var/lib/genhook \
        --shell /usr/sbin/nologin genhook \
    && mkdir -p /var/lib/genhook /models \
    && chown genhook:genhook /var/lib/genhook /models
COPY --from=build /opt/genhook /opt/genhook
COPY deploy/container/healthcheck.py /opt/genhook/healthcheck.py
ENV PATH=/opt/genhook/bin:$PATH \
    PYTHONUNBUFFERED=1 \
    PYTHONDONTWRITEBYTECODE=1 \
    HF_HUB_OFFLINE=1 \
    TRANSFORMERS_OFFLINE=1 \
    GENHOOK_DATA_DIR=/var/lib/genhook \
    GENHOOK_HOST=0.0.0.0 \
    GENHOOK_PORT=8000 \
    GENHOOK_HEALTH_HOST=0.0.0.0 \
    GENHOOK_HEALTH_PORT=8001
VOLUME ["/var/lib/genhook", "/models"]
WORKDIR /var/lib/genhook
USER 10001:10001
EXPOSE 8000 8001
# /readyz of the role this container runs: the api's port, or a worker's or dispatcher's
# health port (docker and podman keep this with --format docker; Kubernetes uses its probes).
HEALTHCHECK --interval=10s --timeout=3s --start-period=60s --retries=3 \
    CMD ["/usr/bin/python3", "/opt/genhook/healthcheck.py"]
ENTRYPOINT ["genhook"]
CMD ["api"]

FROM cpu AS cuda
USER root
COPY --from=build-cuda /opt/genhook /opt/genhook
ENV NVIDIA_VISIBLE_DEVICES=all NVIDIA_DRIVER_CAPABILITIES=compute,utility
USER 10001:10001

# The default target: `docker build .` is the CPU image.
FROM cpu
