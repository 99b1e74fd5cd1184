"""A job costs nothing above its own work (11.4): the worker loads what jobs need once, at start, and runs each
job in its own process (no work horse forked per job, which started every job cold: new connections, empty
statement caches)."""

import sqlalchemy as sa

import worker
from tests import sample_jobs
from tests.conftest import wait_for
from webapp import prompting, tokens
from webapp.extensions import db
from webapp.jobs.queue import enqueue
from webapp.jobs.runs import JOB_TYPES
from webapp.models import JobRun
from webapp.search import embedder


def test_preload_loads_the_tokenizer_embedder_jobs_and_templates(app, monkeypatch):
    tokens.encoder.cache_clear()
    monkeypatch.setattr(embedder, "_local_embedder", None)

    worker.preload(app)

    assert tokens.encoder.cache_info().currsize == 1
    assert embedder._local_embedder is not None  # a reply's query embedding does not wait for it
    assert {"reply", "consolidate", "summarize"} <= set(JOB_TYPES)
    assert len(prompting._env.cache) >= 5  # every prompt template parsed


def test_preload_leaves_the_local_embedder_unloaded_when_an_endpoint_embeds(app, monkeypatch):
    app.config["EMBEDDING_BASE_URL"] = "http://127.0.0.1:9/v1"
    monkeypatch.setattr(embedder, "_local_embedder", None)

    worker.preload(app)

    assert embedder._local_embedder is None


def test_jobs_run_in_the_worker_process_itself(live_app, worker_process):
    for _ in range(2):
        enqueue(sample_jobs.process_id)
    db.session.commit()

    def finished() -> list[JobRun]:
        db.session.expire_all()
        runs = db.session.scalars(sa.select(JobRun).where(JobRun.job_type == "sample_pid")).all()
        return runs if [r.status for r in runs] == ["done", "done"] else []

    runs = wait_for(finished, 60, "both jobs")
    assert [r.counts["pid"] for r in runs] == [worker_process.pid, worker_process.pid]
