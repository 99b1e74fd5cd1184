"""Recurring jobs are registered under stable ids, once, with their next run time."""

import time_machine

from webapp.jobs import schedule


def test_sync_registers_every_cadence_once_however_often_it_runs(app, runner):
    runner.invoke(args=["schedule", "sync"])
    result = runner.invoke(args=["schedule", "sync"])

    assert result.exit_code == 0, result.output
    ids = [job_id for job_id, _, _ in schedule.registered()]
    assert sorted(ids) == sorted(s.id for s in schedule.SCHEDULES)
    assert len(list(schedule.scheduler().get_jobs())) == len(schedule.SCHEDULES)


def test_sync_drops_a_cadence_that_is_no_longer_listed(app, monkeypatch):
    gone = schedule.Schedule("cairn-retired", schedule.HOURLY, "webapp.jobs.ping.ping")
    monkeypatch.setattr(schedule, "SCHEDULES", [*schedule.SCHEDULES, gone])
    schedule.sync()
    monkeypatch.setattr(schedule, "SCHEDULES", schedule.SCHEDULES[:-1])

    schedule.sync()

    assert "cairn-retired" not in [job_id for job_id, _, _ in schedule.registered()]


@time_machine.travel("2026-11-23 02:30:00Z", tick=False)  # a Monday
def test_list_shows_the_next_run_of_each_cadence(app, runner, monkeypatch):
    monkeypatch.setattr(
        schedule,
        "SCHEDULES",
        [
            schedule.Schedule("cairn-h", schedule.HOURLY, "webapp.jobs.ping.ping"),
            schedule.Schedule("cairn-d", schedule.DAILY_0300_UTC, "webapp.jobs.ping.ping"),
            schedule.Schedule("cairn-w", schedule.WEEKLY_MONDAY_0400_UTC, "webapp.jobs.ping.ping"),
        ],
    )
    runner.invoke(args=["schedule", "sync"])

    output = runner.invoke(args=["schedule", "list"]).output

    assert "cairn-h  0 * * * *  next run 2026-11-23 03:00 UTC" in output
    assert "cairn-d  0 3 * * *  next run 2026-11-23 03:00 UTC" in output
    assert "cairn-w  0 4 * * 1  next run 2026-11-23 04:00 UTC" in output


def test_list_says_when_nothing_is_registered(app, runner):
    assert "flask schedule sync" in runner.invoke(args=["schedule", "list"]).output


def test_the_scheduler_comes_back_after_redis_lost_its_data(app, fake_redis):
    """A Redis without persistence that restarts forgets the running scheduler and every recurring job: the
    scheduler notices at its next heartbeat, registers itself again and puts the recurring jobs back."""
    running = schedule.scheduler()
    schedule.sync()
    running.register_birth()
    assert schedule.scheduler_alive()

    fake_redis.flushall()  # what a restart without persistence leaves
    assert not schedule.scheduler_alive() and schedule.registered() == []
    running.heartbeat()

    assert schedule.scheduler_alive()
    assert sorted(job_id for job_id, _, _ in schedule.registered()) == sorted(
        s.id for s in schedule.SCHEDULES
    )
