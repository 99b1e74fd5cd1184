#!/bin/sh
# The image's entrypoint: the name of one of Cairn's processes, or any other command (`flask users create ...`,
# `sh`). compose.yaml runs each process in a container of its own; Docker restarts whichever dies.
set -e

wait_for_database() { # the database's container may still be starting (`docker compose up -d db` returns at once)
  python3 -c '
import os, sys, time, sqlalchemy
engine = sqlalchemy.create_engine(os.environ.get("DATABASE_URL", "sqlite://"))
for attempt in range(90):
    try:
        engine.connect().close()
        sys.exit(0)
    except sqlalchemy.exc.OperationalError as error:
        last = error.orig
        time.sleep(1)
sys.exit(f"The database at DATABASE_URL did not answer in 90 s: {last}")'
}

case "${1:-web}" in
web) # pages and live streams, as `make run` serves them: an open stream is a waiting greenlet, not a thread
  exec gunicorn --worker-class gevent --workers "${WEB_WORKERS:-2}" --worker-connections 2000 \
    --graceful-timeout 3 --bind "0.0.0.0:${PORT:-5000}" --no-control-socket \
    --access-logfile - --access-logformat '%(h)s "%(r)s" %(s)s %(b)s' app:app ;;
mcp) exec flask mcp http --host 0.0.0.0 ;; # MCP over HTTP; web relays /mcp to it (MCP_HOST)
worker) exec python worker.py ;;
replies) exec python worker.py --replies-only ;;
scheduler) exec flask schedule run ;; # exactly one
migrate) # once, before the others start: the schema, then the first admin while no admin can sign in
  wait_for_database
  flask db upgrade
  exec flask users first-admin ;;
import) # a backup on stdin (or the file named) into the new database: README, Moving to PostgreSQL
  wait_for_database
  flask db upgrade
  exec flask backup import "${2:--}" ;;
llm) # the bundled local model's server and the models installed in instance/ (an image built with LOCAL_LLM=1)
  exec python -m webapp.runtime.processes llm-server "${LOCAL_LLM_PORT:-8088}" 0.0.0.0 ;;
*) exec "$@" ;;
esac
