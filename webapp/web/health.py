"""GET /healthz: the state of every component (webapp.runtime.health's probes), the banner naming a part that is down.
Admins also see how search finds (words and meaning, or words only and why), whether any agent's drift alarm is
on and why (issue 23), and each tool server's health as its last call or test found it (issue 41), which never
make it 503.

The report is taken at most once per CACHE_SECONDS per web process (so no visitor can make Cairn call the model
endpoint on every request); anyone gets a plain status with 200 or 503 (for load balancers), signed-in admins
get each component's detail.
"""

import threading
import time
from dataclasses import asdict, dataclass, field

import sqlalchemy as sa
from flask import Blueprint, current_app, jsonify, render_template
from flask.typing import ResponseReturnValue
from flask_login import current_user

from webapp import search
from webapp.extensions import db
from webapp.jobs import embeddings
from webapp.llm import targets
from webapp.local_models.catalog import not_installed
from webapp.models import Account, Agent, Connection, LlmCall
from webapp.models.connections import AnyConnection
from webapp.models.drift import drifts
from webapp.models.proposals import pending_count
from webapp.models.search import EmbeddingQueue
from webapp.models.tool_servers import ToolServer, account_tool_servers
from webapp.runtime.health import PROBES, Check, check_database, first_line, probe_connection
from webapp.search import embedder
from webapp.timeutil import utcnow

bp = Blueprint("health", __name__)
CACHE_SECONDS = 5
WAITING_COUNTED = 10_000  # embedding_queue rows counted at most, so a long backlog costs no long count

# What a user is told on every page while a component is down.
PROBLEMS = {
    "redis": "The job queue (Redis) is down: new messages wait until it is back.",
    "workers": "A worker is missing: replies or memory upkeep wait until one is back.",
    "scheduler": "The scheduler is not running: memory upkeep is paused until it is back.",
    "llm": "The model server is not answering: replies wait until it is back.",
}
NOT_INSTALLED = (
    "The local model server is not installed here, so agents on {name} cannot answer: an admin can give them "
    "another model (Connections) or set LLM_BASE_URL."
)


def connections_in_use(account_id: int) -> dict[str, Check]:
    """The state of each connection an agent of the account (or its memory jobs) uses, by its name: the
    environment's as the cached report says, the others probed at most once per CACHE_SECONDS per process."""
    checks = {}
    if _uses_environment(account_id):
        checks[targets.environment_connection().name] = report()["llm"]
    for row in _added_connections_in_use(account_id):
        checks[row.name] = connection_check(row)
    return checks


def _uses_environment(account_id: int) -> bool:
    return db.session.scalar(
        sa.select(sa.exists().where(Agent.account_id == account_id, Agent.connection_id.is_(None)))
    )


def not_here(name: str) -> bool:
    """Whether a part is absent by how Cairn was installed rather than down: the model that runs here, on a
    machine without the local model server (the `local-llm` extra, which a server on a hosted provider leaves
    out). Restarting brings nothing back, so it does not make /healthz 503; the agents that use it say so."""
    return name == "llm" and targets.environment_connection().kind == "local" and bool(not_installed())


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
            check = probe_connection(connection)
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
        return Check(False, f"unknown: cannot ask the database ({e.__class__.__name__}: {first_line(e)})")


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


def tool_server_checks(account_id: int) -> dict[str, Check]:
    """Each tool server of the account by its name, as its last call or test found it (none is started here)."""
    return {server.name: _tool_server_check(server) for server in account_tool_servers(account_id)}


def _tool_server_check(server: ToolServer) -> Check:
    if server.checked_at is None:
        return Check(False, "not checked yet")
    when = f"checked {server.checked_at:%Y-%m-%d %H:%M} UTC"
    if server.status == "ok":
        count = len(server.usable_tools)
        return Check(True, f"up: {count} tool{'' if count == 1 else 's'} offered ({when})")
    return Check(False, f"down: {server.status_error} ({when})")


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
    found = [PROBLEMS[name] for name, check in report().items() if not check.ok and not not_here(name)]
    if current_user.is_authenticated:
        if not_here("llm") and _uses_environment(current_user.account_id):
            found.append(NOT_INSTALLED.format(name=targets.environment_connection().name))
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
        if not (check := connection_check(connection)).ok and connection.kind == "local" and not_here("llm"):
            found.append(f"{agent.name}'s model ({agent.model_id}) cannot answer: {check.detail}")
        elif not check.ok:
            found.append(
                f"{agent.name}'s model ({agent.model_id} at {connection.name}) is not answering: a message to "
                f"{agent.name} waits until it is back ({check.detail})."
            )
    return found


@bp.app_context_processor
def _service_status():
    return {
        "service_problems": problems,
        "model_problems": model_problems,
        "local_server_missing": not_installed,  # the local models page, Connections, the admin's Chats page
    }


@bp.get("/healthz")
def healthz() -> ResponseReturnValue:
    """200 when every component is up, 503 otherwise; each component's detail only for signed-in admins."""
    checks = {"database": check_database(), **report()}
    ok = all(c.ok or not_here(name) for name, c in checks.items())
    body = {"status": "ok" if ok else "degraded"}
    if current_user.is_authenticated and current_user.is_admin:
        checks["search"] = check_search()  # after the status: search still works by words alone
        checks["memory"] = check_memory()  # after the status too: an alarm stages changes, nothing is down
        # each connection the account's agents use, by name: one that is down stops only its own agents
        body["connections"] = {k: asdict(v) for k, v in connections_in_use(current_user.account_id).items()}
        # each tool server of the account, by name: one that is down leaves only its tools out of replies
        body["tool_servers"] = {k: asdict(v) for k, v in tool_server_checks(current_user.account_id).items()}
        body["checks"] = {k: asdict(v) for k, v in checks.items()}
    return jsonify(body), 200 if ok else 503


@bp.get("/service-status")
def service_status() -> ResponseReturnValue:
    """The banner alone, which every page refreshes."""
    return render_template("_service_status.html")
