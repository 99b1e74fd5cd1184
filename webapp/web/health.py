"""GET /healthz: the state of every component, the banner naming a part that is down, and `flask check`'s probes.
Admins also see how search finds (words and meaning, or words only and why) and whether any agent's drift alarm is
on and why (issue 23), which never make it 503.

The report is taken at most once per CACHE_SECONDS per web process (so no visitor can make Cairn call the model
endpoint on every request); anyone gets a plain status with 200 or 503 (for load balancers), signed-in admins
get each component's detail.
"""

import threading
import time
from dataclasses import asdict, dataclass, field
from datetime import timedelta
from urllib.parse import urlsplit, urlunsplit

import sqlalchemy as sa
from flask import Blueprint, current_app, jsonify, render_template
from flask.typing import ResponseReturnValue
from flask_login import current_user
from redis.exceptions import RedisError
from rq import Worker
from sqlalchemy.engine import make_url

from webapp import search
from webapp.extensions import db
from webapp.jobs import embeddings
from webapp.jobs.queue import redis_connection, worker_queues
from webapp.jobs.schedule import scheduler_alive
from webapp.llm import providers, targets
from webapp.models import Account, Agent, Connection, LlmCall
from webapp.models.connections import AnyConnection
from webapp.models.drift import drifts
from webapp.models.proposals import pending_count
from webapp.models.search import EmbeddingQueue
from webapp.search import embedder
from webapp.timeutil import utcnow

bp = Blueprint("health", __name__)
CACHE_SECONDS = 5
PROBE_TIMEOUT_SECONDS = 3  # a model endpoint's probe
# worker.py's workers heartbeat every WORKER_TTL_SECONDS / 2 while idle and every 30 s during a job; one whose
# last heartbeat is older than this is dead (RQ itself keeps a killed worker registered for minutes).
WORKER_TTL_SECONDS = 30
WORKER_SILENT_AFTER = timedelta(seconds=75)
WAITING_COUNTED = 10_000  # embedding_queue rows counted at most, so a long backlog costs no long count

# What a user is told on every page while a component is down.
PROBLEMS = {
    "redis": "The job queue (Redis) is down: new messages wait until it is back.",
    "workers": "A worker is missing: replies or memory upkeep wait until one is back.",
    "scheduler": "The scheduler is not running: memory upkeep is paused until it is back.",
    "llm": "The model server is not answering: replies wait until it is back.",
}


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
        return Check(False, f"cannot connect to {url}: {e.__class__.__name__}: {_first_line(e)}")
    return Check(True, url)


def without_password(url: str) -> str:
    """The URL as it may be shown to anyone: any password replaced by ***."""
    parts = urlsplit(url)
    if parts.password is None:
        return url
    netloc = parts.netloc.replace(f":{parts.password}@", ":***@", 1)
    return urlunsplit(parts._replace(netloc=netloc))


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
    return _probe(targets.environment_connection())


def _probe(connection: AnyConnection) -> Check:
    url = without_password(connection.base_url)
    try:
        models = [m["id"] for m in providers.list_models(connection, timeout=PROBE_TIMEOUT_SECONDS)]
    except providers.ProviderError as e:
        return Check(False, f"cannot reach {url}: {e}")
    return Check(True, f"{url} serves {', '.join(models[:5]) or 'no listed models'}")


def connections_in_use(account_id: int) -> dict[str, Check]:
    """The state of each connection an agent of the account (or its memory jobs) uses, by its name: the
    environment's as the cached report says, the others probed at most once per CACHE_SECONDS per process."""
    checks = {}
    uses_environment = db.session.scalar(
        sa.select(sa.exists().where(Agent.account_id == account_id, Agent.connection_id.is_(None)))
    )
    if uses_environment:
        checks[targets.environment_connection().name] = report()["llm"]
    for row in _added_connections_in_use(account_id):
        checks[row.name] = connection_check(row)
    return checks


def _added_connections_in_use(account_id: int) -> list[Connection]:
    """The account's own connections that an agent or its memory jobs use (one query)."""
    return db.session.scalars(
        sa.select(Connection).where(
            Connection.account_id == account_id,
            sa.or_(
                Connection.id.in_(sa.select(Agent.connection_id).where(Agent.account_id == account_id)),
                Connection.id.in_(
                    sa.select(Account.background_connection_id).where(Account.id == account_id)
                ),
            ),
        )
    ).all()


def connection_check(connection: AnyConnection) -> Check:
    """The connection's state, probed at most once per CACHE_SECONDS in this process (the environment's: the
    cached report's)."""
    if connection.id is None:
        return report()["llm"]
    cache = current_app.extensions["connection_health"]
    identity = (connection.id, connection.base_url, connection.updated_at)
    with cache.lock:
        taken_at, check = cache.checks.get(identity, (float("-inf"), None))
        if time.monotonic() - taken_at >= CACHE_SECONDS:
            check = _probe(connection)
            cache.checks[identity] = (time.monotonic(), check)
    return check


def check_search() -> Check:
    """How search finds: by words and meaning, or by words only and why. Search works either way, so this part
    never makes /healthz 503; ok is whether meaning is searched too. A few small queries, like the database's
    check, so it is taken on each admin view rather than cached."""
    try:
        return _search_mode()
    except sa.exc.SQLAlchemyError as e:
        db.session.rollback()
        return Check(False, f"unknown: cannot ask the database ({e.__class__.__name__}: {_first_line(e)})")


def _search_mode() -> Check:
    if not search.backend().vectors_available():
        return Check(False, f"words only: {embeddings.no_vectors_reason()}")
    last = db.session.execute(
        sa.select(LlmCall.status, LlmCall.error)
        .where(LlmCall.purpose == "embedding")
        .order_by(LlmCall.id.desc())
        .limit(1)
    ).first()
    if last is not None and last.status == "error":
        error = last.error or "no reason given"
        return Check(False, f"words only: {error[:1].lower()}{error[1:]}")
    detail = f"words and meaning ({embedder.model_name()})"
    queued = sa.select(sa.literal(1)).select_from(EmbeddingQueue).limit(WAITING_COUNTED + 1).subquery()
    waiting = db.session.scalar(sa.select(sa.func.count()).select_from(queued))
    if waiting > WAITING_COUNTED:
        detail += f"; more than {WAITING_COUNTED:,} memories and messages wait for their vectors"
    elif waiting:
        detail += f"; {waiting:,} " + (
            "memory or message waits for its vector"
            if waiting == 1
            else "memories and messages wait for their vectors"
        )
    return Check(True, detail)


def check_memory() -> Check:
    """The drift alarm of each agent of the signed-in admin's account, and how many proposals wait for review:
    not ok while an alarm is on (its reason is the detail). Like search, never a reason for 503."""
    now = utcnow()
    agents = dict(
        db.session.execute(
            sa.select(Agent.id, Agent.name).where(Agent.account_id == current_user.account_id)
        ).all()
    )
    alarms = [
        f"{agents[agent_id]}: {drift.reason}"
        for agent_id, drift in drifts(agents, now, current_app.config["DRIFT_ALARM_SHARE"]).items()
        if drift.alarm
    ]
    waiting = pending_count(current_user.account_id, now)[0]
    review = f"{waiting} proposal{'' if waiting == 1 else 's'} of memory changes wait{'s' if waiting == 1 else ''} for review"
    if alarms:
        return Check(False, f"drift alarm: {' '.join(alarms)} ({review})")
    return Check(True, f"no drift alarm; {review}")


def _first_line(error: Exception) -> str:
    return str(error).strip().splitlines()[0] if str(error).strip() else ""


# Cached and shown in the banner. The database is checked apart, on /healthz only: it is one cheap query, and a
# page that renders has reached the database anyway (pages keep a constant number of queries).
PROBES = {
    "redis": check_redis,
    "workers": check_workers,
    "scheduler": check_scheduler,
    "llm": check_llm,
}


def _take_report() -> dict[str, Check]:
    checks = {}
    for name, probe in PROBES.items():
        if name in ("workers", "scheduler") and not checks["redis"].ok:
            checks[name] = Check(False, "unknown while redis is down")  # no second wait on the same timeout
        else:
            checks[name] = probe()
    return checks


@dataclass
class ReportCache:
    """The last report of this process, shared by its threads; one thread probes while the others wait."""

    lock: threading.Lock = field(default_factory=threading.Lock)
    checks: dict[str, Check] = field(default_factory=dict)
    taken_at: float = float("-inf")


@bp.record_once
def _init(state) -> None:
    state.app.extensions["health_report"] = ReportCache()
    state.app.extensions["connection_health"] = ReportCache()


def report() -> dict[str, Check]:
    """Each component's check but the database's, at most CACHE_SECONDS old."""
    cache: ReportCache = current_app.extensions["health_report"]
    with cache.lock:
        if time.monotonic() - cache.taken_at >= CACHE_SECONDS:
            cache.checks = _take_report()
            cache.taken_at = time.monotonic()
        return cache.checks


def problems() -> list[str]:
    """One plain sentence for each component that is down, and for each connection of the signed-in person's
    account that its agents use and that does not answer (the environment's is the "llm" component)."""
    found = [PROBLEMS[name] for name, check in report().items() if not check.ok]
    if current_user.is_authenticated:
        for row in _added_connections_in_use(current_user.account_id):
            if not (check := connection_check(row)).ok:
                found.append(
                    f"The connection {row.name} is not answering: its agents' replies wait until it is back "
                    f"({check.detail})."
                )
    return found


def model_problems(agents: list[Agent]) -> list[str]:
    """A sentence for each of these agents whose connection does not answer (the chat page says so before
    anyone writes to it)."""
    found = []
    for agent in agents:
        connection = targets.connection_of(agent)
        if not (check := connection_check(connection)).ok:
            found.append(
                f"{agent.name}'s model ({agent.model_id} at {connection.name}) is not answering: a message to "
                f"{agent.name} waits until it is back ({check.detail})."
            )
    return found


@bp.app_context_processor
def _service_status():
    return {"service_problems": problems, "model_problems": model_problems}


@bp.get("/healthz")
def healthz() -> ResponseReturnValue:
    """200 when every component is up, 503 otherwise; each component's detail only for signed-in admins."""
    checks = {"database": check_database(), **report()}
    ok = all(c.ok for c in checks.values())
    body = {"status": "ok" if ok else "degraded"}
    if current_user.is_authenticated and current_user.is_admin:
        checks["search"] = check_search()  # after the status: search still works by words alone
        checks["memory"] = check_memory()  # after the status too: an alarm stages changes, nothing is down
        # each connection the account's agents use, by name: one that is down stops only its own agents
        body["connections"] = {k: asdict(v) for k, v in connections_in_use(current_user.account_id).items()}
        body["checks"] = {k: asdict(v) for k, v in checks.items()}
    return jsonify(body), 200 if ok else 503


@bp.get("/service-status")
def service_status() -> ResponseReturnValue:
    """The banner alone, which every page refreshes."""
    return render_template("_service_status.html")
