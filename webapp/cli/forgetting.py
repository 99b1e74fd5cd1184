"""`flask memories forget ID --by EMAIL`: a person forgets a memory drawn from their chats, as on "What agents
remember of me" (webapp.actions.forgetting)."""

import sys

import click
import sqlalchemy as sa

from webapp.actions import forgetting
from webapp.cli.memories import memories_cli
from webapp.extensions import db
from webapp.models import User


@memories_cli.command("forget")
@click.argument("memory_id", type=click.IntRange(min=1))
@click.option(
    "--by", "email", required=True, help="The person who forgets it: it must be drawn from their chats."
)
def forget(memory_id: int, email: str) -> None:
    """Forget a memory drawn from a chat of the person's, as they would on "What agents remember of me" (audited
    as them; an admin can undo it). Any other memory is refused without saying whether it exists."""
    person = db.session.scalar(
        sa.select(User).where(User.email == email.strip().lower(), User.removed_at.is_(None))
    )
    if person is None:
        sys.exit(f"No one signs in with {email}.")
    try:
        memory = forgetting.forget(person, memory_id, via="forget-cli")
    except forgetting.NotYours as refusal:
        sys.exit(str(refusal))
    click.echo(
        f"Forgotten by {person.email}: memory {memory.id} of {memory.agent.name}, “{memory.content[:80]}”."
    )


COMMANDS: list = []  # a command of `flask memories` (memories_cli), registered there
