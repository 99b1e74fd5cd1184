"""GET /healthz: a plain status for anyone (200 or 503), each component's detail for signed-in admins; the
banner on every page names a part that is down; the model endpoint is probed at most once per cache period."""

from datetime import timedelta

from rq import Worker
from rq.utils import utcformat
from rq_scheduler import Scheduler

from tests.conftest import free_port
from webapp.jobs.queue import init_app
from webapp.runtime import health


def _all_up(fake_redis) -> None:
    Worker(["cairn-replies", "cairn"], connection=fake_redis).register_birth()
    Scheduler(connection=fake_redis).register_birth()


def _unreachable_llm(app) -> str:
    url = f"http://127.0.0.1:{free_port()}/v1"
    app.config["LLM_BASE_URL"] = url
    return url


def test_anyone_gets_a_plain_status_and_503_while_a_part_is_down(client):
    response = client.get("/healthz")

    assert response.status_code == 503
    assert response.get_json() == {"status": "degraded"}


def test_anyone_gets_200_when_all_is_up_and_no_detail(client, fake_redis):
    _all_up(fake_redis)

    response = client.get("/healthz")

    assert response.status_code == 200, response.get_json()
    assert response.get_json() == {"status": "ok"}


def test_a_member_gets_no_detail_either(client, auth, member, fake_redis):
    auth.login(member)

    assert client.get("/healthz").get_json() == {"status": "degraded"}


def test_an_admin_sees_each_component(client, signed_in):
    response = client.get("/healthz")

    assert response.status_code == 503
    checks = response.get_json()["checks"]
    assert checks["database"]["ok"] and checks["redis"]["ok"] and checks["llm"]["ok"]
    assert "fake-model" in checks["llm"]["detail"]
    assert checks["workers"] == {"ok": False, "detail": "0 live worker(s) registered with RQ"}
    assert checks["scheduler"]["ok"] is False


def test_a_queue_no_live_worker_serves_counts_as_down(client, signed_in, fake_redis):
    """A replies-only worker alone answers chats, but background memory work would wait for ever."""
    Worker(["cairn-replies"], connection=fake_redis).register_birth()
    Scheduler(connection=fake_redis).register_birth()

    response = client.get("/healthz")

    assert response.status_code == 503
    assert response.get_json()["checks"]["workers"] == {
        "ok": False,
        "detail": "1 live worker(s) registered with RQ; none serves cairn",
    }


def test_a_worker_that_stopped_heartbeating_counts_as_down(app, client, signed_in, fake_redis):
    worker = Worker(["cairn-replies", "cairn"], connection=fake_redis)
    worker.register_birth()
    Scheduler(connection=fake_redis).register_birth()
    assert client.get("/healthz").status_code == 200

    # Killed with SIGKILL: RQ keeps it registered for minutes, but its heartbeat stops.
    fake_redis.hset(worker.key, "last_heartbeat", utcformat(worker.last_heartbeat - timedelta(minutes=2)))
    app.extensions["health_report"].taken_at = float("-inf")  # past the cache period

    response = client.get("/healthz")
    assert response.status_code == 503
    assert response.get_json()["checks"]["workers"]["detail"] == "0 live worker(s) registered with RQ"


def test_the_model_endpoint_is_probed_once_per_cache_period(client, monkeypatch, fake_redis):
    probes = []
    monkeypatch.setitem(health.PROBES, "llm", lambda: probes.append(1) or health.Check(True, "up"))
    _all_up(fake_redis)

    statuses = [client.get("/healthz").status_code for _ in range(20)]

    assert statuses == [200] * 20
    assert len(probes) == 1


def test_an_unreachable_llm_is_named(app, client, signed_in):
    url = _unreachable_llm(app)

    llm = client.get("/healthz").get_json()["checks"]["llm"]

    assert llm["ok"] is False
    assert url in llm["detail"]


def test_while_redis_is_down_workers_and_scheduler_are_not_asked_again(app, client, signed_in):
    app.config["REDIS_URL"] = f"redis://127.0.0.1:{free_port()}/0"
    init_app(app)

    checks = client.get("/healthz").get_json()["checks"]

    assert checks["redis"]["ok"] is False
    assert checks["workers"] == checks["scheduler"] == {"ok": False, "detail": "unknown while redis is down"}


def test_credentials_never_appear_in_the_health_report(app, client, signed_in):
    app.config["REDIS_URL"] = f"redis://:s3cret@127.0.0.1:{free_port()}/0"
    init_app(app)

    body = client.get("/healthz").text

    assert "s3cret" not in body and "redis://:***@127.0.0.1" in body


def test_the_chat_pages_say_which_part_is_down(app, client, auth, member, fake_redis):
    _all_up(fake_redis)
    auth.login(member)
    assert "is not answering" not in client.get("/chats/").text

    _unreachable_llm(app)
    app.extensions["health_report"].taken_at = float("-inf")
    page = client.get("/chats/").text

    assert "The model server is not answering: replies wait until it is back." in page
    assert "A worker is missing" not in page


def test_the_banner_refreshes_itself_and_is_empty_for_visitors(app, client, auth, member):
    assert client.get("/service-status").text.strip() == ""

    auth.login(member)
    banner = client.get("/service-status").text

    assert 'hx-get="/service-status"' in banner and 'hx-trigger="every 15s"' in banner
    assert "A worker is missing: replies or memory upkeep wait until one is back." in banner
