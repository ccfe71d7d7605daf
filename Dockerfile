# dtq image: `dtq` is the entrypoint, so the service's command picks the role:
#   docker build -t dtq .                                   # core only
#   docker build -t dtq:examples --build-arg DTQ_EXTRAS=examples .   # + examples/topk's scikit-learn
#   docker run --rm -e CRDB_DSN=... dtq migrate
#   docker run --rm -e CRDB_DSN=... -e REDIS_ADDR=... -p 8080:8080 dtq orchestrator
#   docker run --rm -e CRDB_DSN=... -e REDIS_ADDR=... dtq worker --app examples.topk.app:runtime
# docker-compose.yml (`make up`) builds and runs the whole stack from it (README, "Running the
# whole stack with Docker").

ARG PYTHON_IMAGE=python:3.11-slim-bookworm

# --- builder: a wheel of dtq with the migrations packaged inside, installed into /opt/dtq -------
FROM ${PYTHON_IMAGE} AS builder

# Extras to install with dtq, comma-separated (e.g. "examples" or "examples,s3"); none by default.
ARG DTQ_EXTRAS=""

ENV PIP_NO_CACHE_DIR=1 \
    PIP_DISABLE_PIP_VERSION_CHECK=1 \
    PYTHONDONTWRITEBYTECODE=1

WORKDIR /src
COPY pyproject.toml README.md ./
COPY src ./src
COPY migrations ./migrations

# `dtq migrate` reads the packaged copy first (dtq/adapters/cockroach/migrate.py), so the image
# needs no source checkout; pyproject's package-data ships these files in the wheel.
RUN cp -r migrations src/dtq/adapters/cockroach/migrations \
 && python -m pip wheel --no-deps --wheel-dir /wheels . \
 && python -m venv /opt/dtq \
 && wheel="$(ls /wheels/dtq-*.whl)" \
 && /opt/dtq/bin/pip install "${wheel}${DTQ_EXTRAS:+[${DTQ_EXTRAS}]}" \
 && /opt/dtq/bin/python -c "from dtq.adapters.cockroach.migrate import default_migrations_dir as d; assert 'site-packages' in str(d()), d()"

# --- runtime: the venv, the example apps, a non-root user ---------------------------------------
FROM ${PYTHON_IMAGE} AS runtime

RUN groupadd --system --gid 10001 dtq \
 && useradd --system --uid 10001 --gid dtq --home-dir /app --no-create-home \
      --shell /usr/sbin/nologin dtq

COPY --from=builder /opt/dtq /opt/dtq

WORKDIR /app
# `--app examples.topk.app:runtime` imports from the working directory (needs DTQ_EXTRAS=examples).
COPY examples ./examples
RUN mkdir -p /app/artifacts && chown dtq:dtq /app/artifacts

ENV PATH=/opt/dtq/bin:$PATH \
    PYTHONUNBUFFERED=1 \
    PYTHONDONTWRITEBYTECODE=1 \
    LOG_FORMAT=json \
    ORCHESTRATOR_LISTEN=:8080 \
    ARTIFACT_DIR=/app/artifacts

USER 10001:10001

# 8080: the orchestrator's API, /healthz and /metrics; 9100: a worker's WORKER_METRICS_LISTEN.
EXPOSE 8080 9100

ENTRYPOINT ["dtq"]
CMD ["--help"]
