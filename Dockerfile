# One image for every isosweep service (api, ray-head + runner, ray-worker).
# torch==2.14.1 from PyPI is a CUDA build on x86_64: the same image runs CPU and GPU workers.
FROM python:3.11-slim

ENV PYTHONUNBUFFERED=1 \
    PIP_NO_CACHE_DIR=1 \
    PIP_DISABLE_PIP_VERSION_CHECK=1 \
    ISOSWEEP_DATA_DIR=/data

WORKDIR /app
COPY pyproject.toml README.md ./
COPY service ./service
COPY workers ./workers
COPY api ./api
COPY examples ./examples
RUN pip install . && mkdir -p /data

EXPOSE 8000 6379 8265
CMD ["isosweep", "serve", "--host", "0.0.0.0", "--no-runner"]
