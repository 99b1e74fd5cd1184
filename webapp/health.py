"""GET /healthz: the state of every component, and the checks `flask check` runs at start-up."""

from dataclasses import asdict, dataclass
from urllib.parse import urlsplit, urlunsplit

import sqlalchemy as sa
from flask import Blueprint, current_app, jsonify
from rq import Worker
from sqlalchemy.engine import make_url

from webapp.extensions import db
from webapp.queue import redis_connection
from webapp.schedule import scheduler_alive

bp = Blueprint("health", __name__)


@dataclass
class Check:
    ok: bool
    detail: str


def check_database() -> Check:
    url = make_url(current_app.config["SQLALCHEMY_DATABASE_URI"]).render_as_string(hide_password=True)
    try:
        with db.engine.connect() as conn:
            conn.execute(sa.text("SELECT 1"))
    except sa.exc.SQLAlchemyError as e:
        return Check(False, f"cannot connect to {url}: {e.__class__.__name__}: {_first_line(e)}")
    return Check(True, url)


def _without_password(url: str) -> str:
    """The URL as it may be shown to anyone: any password replaced by ***."""
    parts = urlsplit(url)
    if parts.password is None:
        return url
    netloc = parts.netloc.replace(f":{parts.password}@", ":***@", 1)
    return urlunsplit(parts._replace(netloc=netloc))


def check_redis() -> Check:
    url = _without_password(current_app.config["REDIS_URL"])
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
        count = Worker.count(connection=redis_connection())
    except Exception as e:  # noqa: BLE001  (redis is down: reported by check_redis too)
        return Check(False, f"cannot ask redis: {e}")
    return Check(count > 0, f"{count} worker(s) registered with RQ")


def check_scheduler() -> Check:
    try:
        alive = scheduler_alive()
    except Exception as e:  # noqa: BLE001
        return Check(False, f"cannot ask redis: {e}")
    return Check(alive, "rq-scheduler is running" if alive else "no rq-scheduler is running")


def check_llm() -> Check:
    url = _without_password(current_app.config["LLM_BASE_URL"])
    client = current_app.extensions["llm_client"].with_options(timeout=3)
    try:
        models = [m.id for m in client.models.list()]
    except Exception as e:  # noqa: BLE001  (any failure means the endpoint is not usable)
        return Check(False, f"cannot reach {url}: {e}")
    return Check(True, f"{url} serves {', '.join(models[:5]) or 'no listed models'}")


def _first_line(error: Exception) -> str:
    return str(error).strip().splitlines()[0] if str(error).strip() else ""


@bp.get("/healthz")
def healthz():
    """Report each component; 200 when all are up, 503 otherwise."""
    checks = {
        "database": check_database(),
        "redis": check_redis(),
        "workers": check_workers(),
        "scheduler": check_scheduler(),
        "llm": check_llm(),
    }
    ok = all(c.ok for c in checks.values())
    body = {"status": "ok" if ok else "degraded", "checks": {k: asdict(v) for k, v in checks.items()}}
    return jsonify(body), 200 if ok else 503
