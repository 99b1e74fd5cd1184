"""Recurring jobs, registered with rq-scheduler under stable ids. Adding a cadence is one line in SCHEDULES."""

import os
import time
import warnings
from dataclasses import dataclass
from datetime import datetime

from flask import current_app
from rq_scheduler import Scheduler
from werkzeug.utils import import_string

from webapp.jobs.queue import redis_connection, rq_queue

# rq-scheduler computes cron times with `crontab` without its default_utc argument, which warns on every
# computation that a future crontab may change the default. Cairn runs the scheduler on UTC (_use_utc), where
# both defaults give the same times, so the warning is noise in `make run`.
warnings.filterwarnings("ignore", category=FutureWarning, module="rq_scheduler.utils")

HOURLY = "0 * * * *"
HOURLY_AT_15 = "15 * * * *"  # apart from the hourly consolidation, which keeps the background queue busy
HOURLY_AT_30 = "30 * * * *"
HOURLY_AT_45 = "45 * * * *"
DAILY_0300_UTC = "0 3 * * *"
WEEKLY_MONDAY_0400_UTC = "0 4 * * 1"
ID_PREFIX = "cairn-"


@dataclass(frozen=True)
class Schedule:
    id: str
    cron: str
    func: str  # dotted path, resolved by the worker when the job runs


SCHEDULES = [
    Schedule(f"{ID_PREFIX}consolidate", HOURLY, "webapp.jobs.consolidation.consolidate_stale_chats"),
    Schedule(f"{ID_PREFIX}reflect", DAILY_0300_UTC, "webapp.jobs.reflection.reflect_all"),
    Schedule(f"{ID_PREFIX}refine", WEEKLY_MONDAY_0400_UTC, "webapp.jobs.refinement.refine_due"),
    Schedule(f"{ID_PREFIX}term-stats", HOURLY_AT_30, "webapp.jobs.term_stats.refresh_term_stats"),
    Schedule(f"{ID_PREFIX}embed", HOURLY_AT_15, "webapp.jobs.embeddings.queue_waiting"),
    Schedule(
        f"{ID_PREFIX}temporary-chats",
        HOURLY_AT_45,
        "webapp.jobs.temporary_chats.delete_expired_temporary_chats",
    ),
]


class _Scheduler(Scheduler):
    """rq-scheduler that survives a Redis which lost its data (restarted without persistence): at its next
    heartbeat it registers itself again and puts the recurring jobs back, instead of running on unseen with
    nothing left to schedule."""

    def heartbeat(self) -> None:
        if not self.connection.exists(self.key):
            self.log.warning("Redis forgot this scheduler and its recurring jobs; registering them again")
            self.register_birth()
            sync()
        super().heartbeat()


def scheduler() -> Scheduler:
    return _Scheduler(queue=rq_queue(), connection=redis_connection(), interval=10)


def _use_utc() -> None:
    # rq-scheduler reads cron strings in the process's local time; Cairn's cadences are UTC.
    if os.environ.get("TZ") != "UTC":
        os.environ["TZ"] = "UTC"
        time.tzset()


def sync() -> list[Schedule]:
    """Make rq-scheduler hold exactly SCHEDULES: replace ours, drop ones no longer listed."""
    _use_utc()
    sched = scheduler()
    for job in sched.get_jobs():
        if job.id.startswith(ID_PREFIX):
            sched.cancel(job)
            job.delete()
    for item in SCHEDULES:
        sched.cron(
            item.cron,
            func=item.func,
            id=item.id,
            queue_name=current_app.config["RQ_QUEUE"],
            use_local_timezone=False,
            result_ttl=86400,
            timeout=import_string(item.func).job_kind.timeout_for(()),
        )
    return SCHEDULES


def registered() -> list[tuple[str, str, datetime]]:
    """(id, cron, next run in UTC) for each recurring job rq-scheduler holds."""
    return [
        (job.id, job.meta.get("cron_string", ""), when)
        for job, when in scheduler().get_jobs(with_times=True)
        if job.id.startswith(ID_PREFIX)
    ]


def scheduler_alive() -> bool:
    """True when a running rq-scheduler has registered itself (its key expires if it dies)."""
    conn = redis_connection()
    for key in conn.scan_iter(match=f"{Scheduler.redis_scheduler_namespace_prefix}*"):
        if not conn.hexists(key, "death"):
            return True
    return False
