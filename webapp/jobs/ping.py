import sqlalchemy as sa

from webapp.extensions import db
from webapp.jobs.queue import recorded_job


@recorded_job("ping", "Check the worker")
def ping() -> dict[str, int]:
    """Prove the worker end to end: it has an app context, reaches the database and records its run."""
    return {"database": db.session.scalar(sa.select(1))}
