# The durable-sse worker (and CLI). Secrets come from the environment at run time.
FROM python:3.11-slim
WORKDIR /app
# What the wheel is built from (pyproject finds every package under these; CI builds a wheel
# of the same files, installs it in a scratch venv, imports every module: scripts/wheel-check).
COPY pyproject.toml README.md ./
COPY durable_sse ./durable_sse
COPY workflows ./workflows
COPY activities ./activities
COPY worker.py ./
COPY examples ./examples
RUN pip install --no-cache-dir .
USER nobody
ENTRYPOINT ["durable-sse"]
CMD ["worker"]
