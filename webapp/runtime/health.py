"""Whether each process and service Cairn needs answers: the database, Redis, the workers, the scheduler and
the environment's model endpoint. `flask check` asks them before start-up; /healthz and every page's banner
(webapp.web.health) ask them through a short cache."""

from dataclasses import dataclass
from datetime import timedelta
from urllib.parse import urlsplit, urlunsplit

import requests
import sqlalchemy as sa
from flask import current_app
from redis.exceptions import RedisError
from rq import Worker
from sqlalchemy.engine import make_url

from webapp.extensions import db
from webapp.jobs.queue import redis_connection, worker_queues
from webapp.jobs.schedule import scheduler_alive
from webapp.llm import providers, targets
from webapp.local_models.catalog import not_installed
from webapp.models.connections import AnyConnection
from webapp.timeutil import utcnow

PROBE_TIMEOUT_SECONDS = 3  # a model endpoint's probe
# worker.py's workers heartbeat every WORKER_TTL_SECONDS / 2 while idle and every 30 s during a job; one whose
# last heartbeat is older than this is dead (RQ itself keeps a killed worker registered for minutes).
WORKER_TTL_SECONDS = 30
WORKER_SILENT_AFTER = timedelta(seconds=75)


@dataclass
class Check:
    ok: bool
    detail: str


def check_database() -> Check:
    url = make_url(current_app.config["SQLALCHEMY_DATABASE_URI"]).render_as_string(hide_password=True)
    try:  # on the request's own connection: a process under gevent may have only one (config.engine_options)
        db.session.execute(sa.text("SELECT 1"))
    except sa.exc.SQLAlchemyError as e:
        db.session.rollback()
        return Check(False, f"cannot connect to {url}: {e.__class__.__name__}: {first_line(e)}")
    return Check(True, url)


def without_password(url: str) -> str:
    """The URL as it may be shown to anyone: any password replaced by ***."""
    parts = urlsplit(url)
    if parts.password is None:
        return url
    netloc = parts.netloc.replace(f":{parts.password}@", ":***@", 1)
    return urlunsplit(parts._replace(netloc=netloc))


def check_identity_provider() -> Check:
    """OIDC_ISSUER's discovery document answers and names that issuer (webapp.web.oidc signs people in with it)."""
    issuer = current_app.config["OIDC_ISSUER"]
    url = f"{issuer}/.well-known/openid-configuration"
    try:
        response = requests.get(url, timeout=PROBE_TIMEOUT_SECONDS)
        response.raise_for_status()
        named = response.json().get("issuer", "")
    except (requests.RequestException, ValueError, AttributeError) as e:
        return Check(False, f"cannot read {url}: {e.__class__.__name__}: {first_line(e)}")
    if str(named).rstrip("/") != issuer:
        return Check(False, f"{url} names the issuer {named!r}, not {issuer!r}")
    return Check(True, url)


def check_redis() -> Check:
    url = without_password(current_app.config["REDIS_URL"])
    try:
        redis_connection().ping()
    except Exception as e:  # redis-py raises several families (connection, timeout, auth, OS errors)
        return Check(False, f"cannot reach {url}: {_without_secret(str(e))}")
    return Check(True, url)


def _without_secret(text: str) -> str:
    password = urlsplit(current_app.config["REDIS_URL"]).password
    return text.replace(password, "***") if password else text


def check_workers() -> Check:
    try:
        workers = Worker.all(connection=redis_connection())
    except (RedisError, OSError) as e:  # redis is down: reported by check_redis too
        return Check(False, f"cannot ask redis: {e}")
    alive = [w for w in workers if w.death_date is None and _recent(w.last_heartbeat)]
    served = {name for w in alive for name in w.queue_names()}
    unserved = [q.name for q in worker_queues() if q.name not in served]
    detail = f"{len(alive)} live worker(s) registered with RQ"
    if alive and unserved:  # a replies-only worker alone: background memory work waits
        detail += f"; none serves {', '.join(unserved)}"
    return Check(not unserved, detail)


def _recent(heartbeat) -> bool:
    return heartbeat is not None and utcnow() - heartbeat.replace(tzinfo=None) < WORKER_SILENT_AFTER


def check_scheduler() -> Check:
    try:
        alive = scheduler_alive()
    except Exception as e:  # noqa: BLE001
        return Check(False, f"cannot ask redis: {e}")
    return Check(alive, "rq-scheduler is running" if alive else "no rq-scheduler is running")


def check_llm() -> Check:
    """The environment's connection (LLM_BASE_URL, or the model that runs here)."""
    connection = targets.environment_connection()
    if connection.kind == "local" and (missing := not_installed()):
        return Check(False, missing)
    return probe_connection(connection)


def probe_connection(connection: AnyConnection) -> Check:
    url = without_password(connection.base_url)
    try:
        models = [m["id"] for m in providers.list_models(connection, timeout=PROBE_TIMEOUT_SECONDS)]
    except providers.ProviderError as e:
        return Check(False, f"cannot reach {url}: {e}")
    return Check(True, f"{url} serves {', '.join(models[:5]) or 'no listed models'}")


def first_line(error: Exception) -> str:
    return str(error).strip().splitlines()[0] if str(error).strip() else ""


# Cached and shown in the banner. The database is checked apart, on /healthz only: it is one cheap query, and a
# page that renders has reached the database anyway (pages keep a constant number of queries).
PROBES = {
    "redis": check_redis,
    "workers": check_workers,
    "scheduler": check_scheduler,
    "llm": check_llm,
}
