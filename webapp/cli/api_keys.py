"""`flask api-keys`: make, list and revoke the API keys that act as a person (for scripts; people also manage their
own on their account page)."""

import sys

import click
import sqlalchemy as sa
from flask.cli import AppGroup

from webapp.extensions import DATABASE_ID_MAX, db
from webapp.models import ApiKey, User

api_keys_cli = AppGroup("api-keys", help="API keys: each acts as its person for the /v1 API and MCP.")


def _person(email: str) -> User:
    user = db.session.scalar(sa.select(User).where(User.email == email.strip().lower()))
    if user is None:
        sys.exit(f"No user signs in with {email}.")
    if user.is_removed:
        sys.exit(f"{user.email} was removed: a key of theirs would be refused.")
    return user


@api_keys_cli.command("create")
@click.option("--user", "email", required=True, help="The email of the person the key acts as.")
@click.option("--name", required=True, help="What uses the key (shown on their account page).")
def create(email: str, name: str) -> None:
    """Make a key and print it (only now: Cairn keeps a fingerprint of it)."""
    if not name.strip():
        sys.exit("Give the key a name (--name): the app or script that uses it.")
    key, secret = ApiKey.issue(_person(email), name)
    db.session.commit()
    click.echo(f"Made the key {key.name!r} (id {key.id}) acting as {key.user.email}; copy it now:", err=True)
    click.echo(secret)


@api_keys_cli.command("list")
@click.option("--user", "email", default=None, help="Only this person's keys.")
def list_keys(email: str | None) -> None:
    """Show the keys (never their secrets): id, person, name, first characters, made, last used, revoked."""
    query = sa.select(ApiKey).join(User, User.id == ApiKey.user_id).order_by(User.email, ApiKey.id)
    if email:
        query = query.where(ApiKey.user_id == _person(email).id)
    for key in db.session.scalars(query):
        used = f"last used {key.last_used_at:%Y-%m-%d %H:%M}" if key.last_used_at else "never used"
        state = f"  revoked {key.revoked_at:%Y-%m-%d}" if key.is_revoked else ""
        click.echo(
            f"{key.id}  {key.user.email}  {key.name!r}  {key.shown}…  made {key.created_at:%Y-%m-%d}  {used}{state}"
        )


@api_keys_cli.command("revoke")
@click.argument("key_id", type=int)
def revoke(key_id: int) -> None:
    """Revoke the key with this id: clients using it are refused from now on."""
    key = db.session.get(ApiKey, key_id) if 0 < key_id <= DATABASE_ID_MAX else None
    if key is None:
        sys.exit(f"No API key has the id {key_id}.")
    if key.is_revoked:
        sys.exit(f"The key {key.name!r} of {key.user.email} was revoked already.")
    key.revoke()
    db.session.commit()
    click.echo(f"Revoked the key {key.name!r} of {key.user.email}.")


COMMANDS = [api_keys_cli]
