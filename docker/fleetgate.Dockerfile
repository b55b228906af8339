# The FleetGate control-plane image: one image runs both `fleetgate operator` and `fleetgate gateway`
# (the Helm chart sets the command). The vLLM engine image is separate (engine_image/).
#
# Build from the repository root:
#   docker build -f docker/fleetgate.Dockerfile -t ghcr.io/fleetgate/fleetgate:0.1.0 .
# Add the semantic cache and tier scorer (sentence-transformers, faiss; about 2 GB more):
#   docker build -f docker/fleetgate.Dockerfile --build-arg EXTRAS=operator,kube,semantic ...

ARG PYTHON_IMAGE=python:3.11-slim-bookworm

FROM ${PYTHON_IMAGE} AS build
WORKDIR /src
RUN pip install --no-cache-dir --upgrade pip build
COPY pyproject.toml setup.py README.md ./
COPY fleetgate ./fleetgate
COPY operator ./operator
COPY gateway ./gateway
COPY router ./router
COPY cache ./cache
COPY engine_image ./engine_image
RUN python -m build --wheel --outdir /wheels .

FROM ${PYTHON_IMAGE}
ARG EXTRAS=operator,kube
# The repository's `operator/` folder is installed as `fleetgate.operator`; nothing named `operator`
# may sit on sys.path, so keep the working directory out of it as the project's scripts do.
ENV PYTHONSAFEPATH=1 \
    PYTHONDONTWRITEBYTECODE=1 \
    PYTHONUNBUFFERED=1 \
    PIP_NO_CACHE_DIR=1 \
    PIP_DISABLE_PIP_VERSION_CHECK=1
COPY --from=build /wheels /wheels
RUN set -eux; \
    wheel="$(ls /wheels/fleetgate-*.whl)"; \
    pip install "${wheel}[${EXTRAS}]"; \
    rm -rf /wheels; \
    groupadd --gid 10001 fleetgate; \
    useradd --uid 10001 --gid 10001 --no-create-home --home-dir /nonexistent --shell /usr/sbin/nologin fleetgate
USER 10001:10001
WORKDIR /tmp
EXPOSE 8080
CMD ["fleetgate", "--help"]
