"""Core CLI commands: start-up checks, schedules, users, the demo data and the ping job."""

import os
import sys

import click
import sqlalchemy as sa
from flask import current_app, url_for
from flask.cli import AppGroup

from webapp.cli.options import now_option
from webapp.extensions import db
from webapp.jobs import schedule
from webapp.jobs.ping import ping
from webapp.jobs.queue import enqueue, wait_for_redis
from webapp.jobs.temporary_chats import delete_expired_temporary_chats
from webapp.local_models.catalog import UNTIL_INSTALLED, not_installed
from webapp.models import Account, Agent, User
from webapp.models.accounts import NO_PASSWORD, SIGN_IN_LINK_MINUTES, PersonChangeRefused, password_problem
from webapp.runtime.health import check_database, check_identity_provider, check_llm, check_redis

schedule_cli = AppGroup("schedule", help="Recurring jobs in rq-scheduler.")
users_cli = AppGroup("users", help="Sign-in accounts.")
jobs_cli = AppGroup("jobs", help="Run background jobs on demand.")
demo_cli = AppGroup("demo", help="Demo data for a first run.")

DEMO_EMAIL = "admin@cairn.local"
DEMO_PASSWORD = "cairn-demo"  # unless DEMO_PASSWORD is set
DEMO_AGENTS = [
    (
        "Ada",
        "You are Ada, a careful and curious research assistant. You answer briefly and cite your reasons.",
    ),
    ("Basil", "You are Basil, a warm and practical helper who likes concrete next steps."),
]


@click.command("check")
def check() -> None:
    """Check every configured external service and name the variable of any that is unreachable."""
    failures = []
    probes = [("DATABASE_URL", check_database)]
    if not current_app.config["EMBEDDED_REDIS"]:
        probes.append(("REDIS_URL", check_redis))
    if not current_app.config["LOCAL_LLM"]:
        probes.append(("LLM_BASE_URL", check_llm))
    if current_app.config["OIDC_ISSUER"]:
        probes.append(("OIDC_ISSUER", check_identity_provider))
    for variable, probe in probes:
        result = probe()
        if result.ok:
            click.echo(f"ok    {variable}: {result.detail}")
        else:
            failures.append(variable)
            source = "set" if os.environ.get(variable) else "default"
            click.echo(f"FAIL  {variable} ({source}): {result.detail}", err=True)
    if current_app.config["LOCAL_LLM"] and (missing := not_installed()):
        # Not a failure: agents may use connections added in the app; those on the environment's model say so.
        click.echo(f"note  LLM_BASE_URL (unset): {missing} {UNTIL_INSTALLED}")
    if failures:
        sys.exit(f"Cairn cannot start: fix {', '.join(failures)} (see above).")


@schedule_cli.command("sync")
def schedule_sync() -> None:
    """Register every recurring job under its stable id (running it again changes nothing)."""
    for item in schedule.sync():
        click.echo(f"registered {item.id}  {item.cron}  {item.func}")


@schedule_cli.command("list")
def schedule_list() -> None:
    """Show the registered recurring jobs with their next run time (UTC)."""
    rows = schedule.registered()
    if not rows:
        click.echo("No recurring jobs registered; run `flask schedule sync`.")
    for job_id, cron, when in rows:
        click.echo(f"{job_id}  {cron}  next run {when:%Y-%m-%d %H:%M} UTC")


@schedule_cli.command("run")
def schedule_run() -> None:
    """Run rq-scheduler in the foreground: it moves due recurring jobs onto the queue."""
    wait_for_redis()
    schedule.sync()  # also puts this process on UTC, so cron strings mean UTC when the scheduler reschedules
    schedule.scheduler().run()


@users_cli.command("create")
@click.argument("email")
@click.option("--password", prompt=True, hide_input=True, confirmation_prompt=True)
@click.option("--admin", is_flag=True, help="Admins manage agents and memory; members chat.")
@click.option("--account", "account_name", default=None, help="Account name (default: the first account).")
def users_create(email: str, password: str, admin: bool, account_name: str | None) -> None:
    """Create a user who signs in with EMAIL and PASSWORD."""
    _create_user(email, password, admin, account_name)


@users_cli.command("first-admin")
def users_first_admin() -> None:
    """Create the first admin from CAIRN_ADMIN_EMAIL and CAIRN_ADMIN_PASSWORD while no admin can sign in yet
    (every start of compose.yaml runs it; once an admin can sign in it changes nothing)."""
    can_sign_in = sa.select(User.id).where(
        User.role == "admin", User.removed_at.is_(None), User.password_hash.not_like(f"{NO_PASSWORD}%")
    )
    if db.session.scalar(can_sign_in.limit(1)):
        return
    email, password = os.environ.get("CAIRN_ADMIN_EMAIL", ""), os.environ.get("CAIRN_ADMIN_PASSWORD", "")
    if not (email.strip() and password):
        click.echo(
            "No admin can sign in yet: set CAIRN_ADMIN_EMAIL and CAIRN_ADMIN_PASSWORD (in .env with compose), "
            "or run `flask users create EMAIL --admin`."
        )
        return
    if db.session.scalar(sa.select(User.id).where(User.email == email.strip().lower())):
        click.echo(
            f"CAIRN_ADMIN_EMAIL {email} is a person here already (invited, removed or a member), so "
            "no first admin was made: name another, or run `flask users create EMAIL --admin`."
        )
        return
    _create_user(email, password, admin=True, account_name=None)


def _create_user(email: str, password: str, admin: bool, account_name: str | None) -> None:
    email = email.strip().lower()
    if db.session.scalar(sa.select(User).where(User.email == email)):
        sys.exit(f"A user with email {email} already exists.")
    if problem := password_problem(password, email):
        sys.exit(problem)
    account = _account(account_name)
    user = User(email=email, account=account, role="admin" if admin else "member")
    user.set_password(password)
    db.session.add(user)
    db.session.commit()
    click.echo(f"Created {user.role} {email} in account {account.name!r}.")


@users_cli.command("link")
@click.argument("email")
@click.option(
    "--base-url",
    default=lambda: f"http://localhost:{os.environ.get('PORT', '5000')}",
    help="Cairn's address as people open it (default: http://localhost:$PORT, 5000).",
)
def users_link(email: str, base_url: str) -> None:
    """Print a link that signs EMAIL in once, within 15 minutes, without a password (with OIDC_ONLY, or while
    the identity provider is down)."""
    user = db.session.scalar(
        sa.select(User).where(User.email == email.strip().lower(), User.removed_at.is_(None))
    )
    if user is None:
        sys.exit(f"Nobody signs in with {email} (or they were removed).")
    token = user.sign_in_link()
    db.session.commit()
    with current_app.test_request_context(base_url=base_url):
        click.echo(url_for("auth.sign_in_link", token=token, _external=True))
    click.echo(f"It signs {user.email} in once, within {SIGN_IN_LINK_MINUTES} minutes.", err=True)


@users_cli.command("list")
def users_list() -> None:
    """Show everyone who may sign in, and those removed, account by account."""
    rows = db.session.execute(
        sa.select(User, Account.name)
        .join(Account)
        .order_by(Account.name, User.removed_at.is_not(None), User.email)
    )
    for user, account_name in rows:
        state = f"removed {user.removed_at:%Y-%m-%d}" if user.is_removed else ""
        state = state or ("invited" if not user.has_password else "")
        click.echo(
            f"{user.email}  {user.role}  {user.display_name!r}  account {account_name!r}  {state}".rstrip()
        )


@users_cli.command("remove")
@click.argument("email")
def users_remove(email: str) -> None:
    """Remove the user who signs in with EMAIL: every sign-in ends now; their chats are kept."""
    user = db.session.scalar(sa.select(User).where(User.email == email.strip().lower()))
    if user is None:
        sys.exit(f"No user signs in with {email}.")
    try:
        user.remove(by=None)
    except PersonChangeRefused as refusal:
        sys.exit(str(refusal))
    db.session.commit()
    click.echo(f"Removed {user.email}: signed out everywhere; their chats are kept.")


def _account(name: str | None) -> Account:
    query = sa.select(Account).order_by(Account.id)
    if name:
        query = query.where(Account.name == name)
    account = db.session.scalar(query)
    if account is None:
        account = Account(name=name or "Cairn")
        db.session.add(account)
    return account


@demo_cli.command("seed")
def demo_seed() -> None:
    """Create a demo admin and two demo agents, unless users already exist."""
    password = os.environ.get("DEMO_PASSWORD", DEMO_PASSWORD)
    if db.session.scalar(sa.select(sa.func.count()).select_from(User)):
        click.echo("Users exist already; no demo data added.")
        return
    account = _account("Demo")
    admin = User(email=DEMO_EMAIL, account=account, role="admin")
    admin.set_password(password)
    db.session.add(admin)
    for name, prompt in DEMO_AGENTS:
        db.session.add(
            Agent(
                account=account,
                name=name,
                system_prompt=prompt,
                model_id=current_app.config["DEFAULT_MODEL_ID"],
            )
        )
    db.session.commit()
    click.echo(f"Demo admin: {DEMO_EMAIL} / {password}")
    if current_app.config["LOCAL_LLM"] and (missing := not_installed()):
        click.echo(f"Its agents are on the environment's model. {missing} {UNTIL_INSTALLED}")


@jobs_cli.command("ping")
@now_option()
def jobs_ping(now: bool) -> None:
    """Enqueue (or run) the ping job, which records itself in job_runs."""
    if now:
        click.echo(f"ping: {ping()}")
        return
    enqueue(ping)
    db.session.commit()
    click.echo("ping enqueued")


@jobs_cli.command("delete-temporary-chats")
@now_option()
def jobs_delete_temporary_chats(now: bool) -> None:
    """Delete for good the temporary chats their people's setting says are due (hourly on its own)."""
    if now:
        click.echo(f"delete-temporary-chats: {delete_expired_temporary_chats()}")
        return
    enqueue(delete_expired_temporary_chats)
    db.session.commit()
    click.echo("delete-temporary-chats enqueued")


COMMANDS = [check, schedule_cli, users_cli, jobs_cli, demo_cli]
