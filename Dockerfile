# The durable-sse worker (and CLI). Secrets come from the environment at run time.
# The lean install: what a production worker needs, none of the embedded stack (the `dev`
# extra: Temporal dev server, redis-server, PostgreSQL), which a worker here never runs.
FROM python:3.11-slim
WORKDIR /app
# What the wheel is built from: the durable_sse package (CI builds a wheel of the same files,
# installs it in a scratch venv, checks its top level, imports every module:
# scripts/wheel-check).
COPY pyproject.toml README.md ./
COPY durable_sse ./durable_sse
COPY examples ./examples
RUN pip install --no-cache-dir .
USER nobody
ENTRYPOINT ["durable-sse"]
CMD ["worker"]
