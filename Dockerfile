# The operator image: the sailplan package with its operator extra (kopf, kubernetes,
# prometheus-client) and the planner it calls. No torch, no trainer dependencies: the
# trainer has its own image (trainer_image/Dockerfile).
#
#   docker build -t sailplan-operator:0.1.0 .
FROM python:3.11-slim-bookworm AS build
ENV PIP_NO_CACHE_DIR=1 \
    PIP_DISABLE_PIP_VERSION_CHECK=1
RUN python -m venv /opt/venv
WORKDIR /src
# Metadata first so the dependency layer is cached across source edits.
COPY pyproject.toml README.md ./
# setuptools maps all three code directories; the trainer's is copied as source only.
COPY planner/ planner/
COPY operator/ operator/
COPY trainer_image/ trainer_image/
# The node agent (manifests/nodeagent) runs from this image too: nodeagent adds nvidia-ml-py.
RUN /opt/venv/bin/pip install ".[operator,nodeagent]"

FROM python:3.11-slim-bookworm
LABEL org.opencontainers.image.title="sailplan-operator" \
      org.opencontainers.image.description="Kubernetes operator that plans and runs heterogeneous GPU training" \
      org.opencontainers.image.licenses="Apache-2.0"
COPY --from=build /opt/venv /opt/venv
ENV PATH=/opt/venv/bin:$PATH \
    PYTHONDONTWRITEBYTECODE=1 \
    PYTHONUNBUFFERED=1
# Numeric non-root user (what runAsNonRoot can verify); no home, no shell needed.
USER 65532:65532
EXPOSE 8080 9090
# The operator's own command set (crds, operator run, profiles): it does not depend on the
# planner/cluster CLI commands importing cleanly.
ENTRYPOINT ["python", "-m", "sailplan.operator"]
CMD ["operator", "run"]
