"""GET /healthz reports each component and answers 503 unless all are up."""

from rq import Worker
from rq_scheduler import Scheduler


def test_reports_missing_worker_and_scheduler_as_down(client):
    response = client.get("/healthz")

    assert response.status_code == 503
    checks = response.get_json()["checks"]
    assert checks["database"]["ok"] and checks["redis"]["ok"] and checks["llm"]["ok"]
    assert checks["workers"] == {"ok": False, "detail": "0 worker(s) registered with RQ"}
    assert checks["scheduler"]["ok"] is False
    assert response.get_json()["status"] == "degraded"


def test_all_up_is_200(app, client, fake_redis):
    Worker(["cairn"], connection=fake_redis).register_birth()
    Scheduler(connection=fake_redis).register_birth()

    response = client.get("/healthz")

    assert response.status_code == 200, response.get_json()
    assert response.get_json()["status"] == "ok"
    assert "fake-model" in response.get_json()["checks"]["llm"]["detail"]


def test_an_unreachable_llm_is_named(app, client):
    from tests.conftest import free_port

    url = f"http://127.0.0.1:{free_port()}/v1"
    app.config["LLM_BASE_URL"] = url
    app.extensions["llm_client"] = app.extensions["llm_client"].with_options(base_url=url)

    llm = client.get("/healthz").get_json()["checks"]["llm"]

    assert llm["ok"] is False
    assert url in llm["detail"]


def test_credentials_never_appear_in_the_health_report(app, client):
    from tests.conftest import free_port
    from webapp.queue import init_app

    app.config["REDIS_URL"] = f"redis://:s3cret@127.0.0.1:{free_port()}/0"
    init_app(app)

    body = client.get("/healthz").text

    assert "s3cret" not in body and "redis://:***@127.0.0.1" in body
