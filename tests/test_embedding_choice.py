"""Issue 30.5: each account chooses its embedder on the Connections page like any model (the environment's
EMBEDDING_* settings until it does); a change embeds everything again in the background while search keeps
ranking by the previous model's vectors, then switches; never a mix of two models."""

import pytest
import sqlalchemy as sa
from rq import SimpleWorker

from tests import factories
from tests.fake_llm import FakeLLM
from webapp import search
from webapp.extensions import db
from webapp.jobs.embeddings import embed_for_new_model, queue_waiting
from webapp.jobs.queue import rq_queue
from webapp.llm import providers as provider_api
from webapp.models import Account, JobRun
from webapp.models import connections as connection_rows
from webapp.search.embedder import EmbeddingError

KEY = "sk-embed-secret-0123456789abcdef"
NEW = "text-embed-2"
HTMX = {"HX-Request": "true", "HX-Target": "embedding-progress"}


@pytest.fixture(scope="module")
def provider():
    server = FakeLLM()
    yield server
    server.close()


@pytest.fixture(autouse=True)
def _fresh_provider(provider):
    provider.reset()
    provider.models = [{"id": NEW}]


@pytest.fixture
def remote_embedder(app, fake_llm):
    """The environment's embedder: the session's fake server, as EMBEDDING_* would set it."""
    app.config.update(EMBEDDING_BASE_URL=fake_llm.base_url, EMBEDDING_MODEL="fake-embedder")
    return "fake-embedder"


@pytest.fixture
def ada(admin):
    return factories.agent(admin.account, "Ada", enabled_tools=["save_memory", "recall"])


def _connect(account, server, key=KEY):
    connection = connection_rows.add(
        account.id, name="Embeddings", kind="openai", base_url=server.base_url, api_key=key
    )
    db.session.flush()
    provider_api.refresh(connection)
    db.session.commit()
    return connection


@pytest.fixture
def embeddings_connection(admin, provider):
    return _connect(admin.account, provider)


def _run_background_jobs(app) -> None:
    SimpleWorker([rq_queue()], connection=app.extensions["redis"]).work(burst=True)


def _models(kind: str, row_id: int) -> set[str]:
    """The models whose vectors the row has."""
    table, key = search.backend().VECTOR_TABLES[kind][:2]
    rows = db.session.execute(sa.text(f"SELECT model FROM {table} WHERE {key} = :id"), {"id": row_id})
    return {model for (model,) in rows}


def _ranked_by(monkeypatch) -> list[str]:
    """The model of the vectors each search by meaning compares (both of the database's vector queries)."""
    seen: list[str] = []
    backend = search.backend()
    by_bits, by_distance = backend.by_bits, backend.by_distance

    def bits(kind, model, *args):
        seen.append(model)
        return by_bits(kind, model, *args)

    def distance(kind, model, *args):
        seen.append(model)
        return by_distance(kind, model, *args)

    monkeypatch.setattr(backend, "by_bits", bits)
    monkeypatch.setattr(backend, "by_distance", distance)
    return seen


def _recall(agent, text: str) -> list[int]:
    vector = search.query_vector(text, agent_id=agent.id)
    return [m.id for m in search.memories(agent.id, text, 5, vector=vector)]


def _account(account_id: int) -> Account:
    db.session.expire_all()
    return db.session.get(Account, account_id)


def _choose(client, connection, model=NEW):
    return client.post(
        "/admin/connections/embeddings",
        data={"embedding_choice": f"{connection.key}|", "embedding_model_id": model},
    )


def test_choosing_a_connection_re_embeds_in_the_background_and_search_switches_only_once_all_are_written(
    app, client, signed_in, ada, provider, fake_llm, remote_embedder, embeddings_connection, monkeypatch
):
    memories = [factories.memory(ada, f"Dana grows {plant}") for plant in ("roses", "tulips", "basil")]
    _run_background_jobs(app)
    assert all(_models("memory", m.id) == {"fake-embedder"} for m in memories)
    new = f"{NEW} @ {embeddings_connection.id}"

    chosen = _choose(client, embeddings_connection)

    assert chosen.status_code == 303
    account = _account(ada.account_id)
    assert (account.embedding_choice, account.embedding_searched) == (
        f"{embeddings_connection.id}|{NEW}",
        "default|",
    )
    run = db.session.scalar(sa.select(JobRun).where(JobRun.job_type == "embed_for_new_model"))
    assert (run.status, run.target, run.account_id) == ("queued", f"account:{ada.account_id}", ada.account_id)
    page = client.get("/admin/connections").text
    assert f"0 of 3</strong> memories and messages have vectors of {NEW} at Embeddings" in page
    assert 'hx-trigger="every 2s"' in page and "keeps ranking by fake-embedder at EMBEDDING_BASE_URL" in page

    # One batch is written, then the new endpoint fails: the run fails, saying why; search keeps the old model.
    rq_queue().empty()  # the run is taken inline here
    monkeypatch.setattr("webapp.search.indexing.BATCH", 1)
    provider.reply(model=NEW)
    provider.fail(500, "embedder overloaded", model=NEW)
    with pytest.raises(EmbeddingError):
        embed_for_new_model(ada.account_id)
    fragment = client.get("/admin/connections", headers=HTMX)
    assert fragment.text.lstrip().startswith('<div id="embedding-progress"')
    assert "1 of 3</strong> memories and messages have vectors" in fragment.text
    assert "The last run failed" in fragment.text and "embedder overloaded" in fragment.text
    assert "HX-Request" in fragment.headers["Vary"]

    ranked_by = _ranked_by(monkeypatch)
    fake_llm.embedding_requests.clear()
    provider.embedding_requests.clear()
    memory = factories.memory(ada, "Dana waters the roses at dawn")  # written meanwhile: embedded by both
    _run_background_jobs(app)
    assert _models("memory", memory.id) == {"fake-embedder", new}
    assert memory.id in _recall(ada, "roses")
    assert set(ranked_by) == {"fake-embedder"}  # the old model's vectors alone, all of them there
    assert [r["model"] for r in fake_llm.embedding_requests] == [
        "fake-embedder",
        "fake-embedder",
    ]  # row, query
    assert [r["model"] for r in provider.embedding_requests] == [NEW]  # the row only

    # The hourly finder queues the failed change again; it finishes, and search switches at once.
    assert queue_waiting()["changing_embedder"] == 1
    _run_background_jobs(app)
    account = _account(ada.account_id)
    assert account.embedding_searched is None
    assert all(_models("memory", m.id) == {new} for m in [*memories, memory])
    ranked_by.clear()
    assert memory.id in _recall(ada, "roses")
    assert set(ranked_by) == {new}
    done = client.get("/admin/connections", headers=HTMX).text
    assert f"Search by meaning uses {NEW} at Embeddings: 4 of 4 memories and messages" in done
    assert "hx-trigger" not in done  # nothing to poll for


def test_with_nothing_chosen_the_environment_settings_embed_as_before(
    app, client, signed_in, ada, remote_embedder
):
    memory = factories.memory(ada, "Dana likes tea")
    _run_background_jobs(app)

    assert _models("memory", memory.id) == {"fake-embedder"}
    page = client.get("/admin/connections").text
    assert '<option selected value="default|">fake-embedder at EMBEDDING_BASE_URL (the default' in page
    assert "Search by meaning uses fake-embedder at EMBEDDING_BASE_URL: 1 of 1 memories" in page


def test_only_admins_choose_and_each_account_chooses_for_itself(
    app, client, auth, ada, member, stranger, provider, remote_embedder, embeddings_connection
):
    globex_connection = _connect(stranger.account, provider)
    globex_agent = factories.agent(stranger.account, "Gia")
    auth.login(member)
    assert _choose(client, embeddings_connection).status_code == 403
    assert client.get("/admin/connections").status_code == 403
    assert _account(ada.account_id).embedding_choice is None
    client.post("/logout")

    auth.login(stranger)
    assert (
        _choose(client, embeddings_connection).status_code == 303
    )  # Acme's connection: not Globex's to pick
    assert _account(stranger.account_id).embedding_choice is None
    assert _choose(client, globex_connection).status_code == 303
    _run_background_jobs(app)
    assert _account(stranger.account_id).embedding_searched is None  # nothing to embed: switched at once

    ours, theirs = factories.memory(ada, "Dana likes tea"), factories.memory(globex_agent, "Eve likes tea")
    _run_background_jobs(app)
    assert _models("memory", ours.id) == {"fake-embedder"}
    assert _models("memory", theirs.id) == {f"{NEW} @ {globex_connection.id}"}
    assert _account(ada.account_id).embedding_choice is None


def test_the_test_says_what_failed_and_the_key_never_shows(
    app, client, signed_in, provider, embeddings_connection
):
    provider.fail(401, "invalid api key", model=NEW)
    failed = client.post(
        "/admin/connections/embeddings/test",
        data={"embedding_choice": f"{embeddings_connection.key}|", "embedding_model_id": NEW},
    )
    worked = client.post(
        "/admin/connections/embeddings/test", data={"embedding_choice": f"{embeddings_connection.key}|{NEW}"}
    )
    unnamed = client.post("/admin/connections/embeddings/test", data={"embedding_choice": "999|x"})

    assert "The test failed." in failed.text
    assert f"Embedding one sentence with {NEW} at Embeddings failed: " in failed.text
    assert "invalid api key" in failed.text
    assert "The test worked." in worked.text and f"{NEW} at Embeddings answered a vector of" in worked.text
    assert "Pick a connection of this account." in unnamed.text
    assert provider.embedding_requests  # with the connection's key, taken from its encrypted column
    for page in (failed.text, worked.text, client.get("/admin/connections").text):
        assert KEY not in page  # the page shows only its last characters, as for any connection
    assert _account(embeddings_connection.account_id).embedding_choice is None  # a test saves nothing


def test_choosing_back_the_model_search_ranks_by_ends_the_change_and_a_connection_in_use_stays(
    app, client, signed_in, ada, remote_embedder, embeddings_connection
):
    memory = factories.memory(ada, "Dana likes tea")
    _run_background_jobs(app)
    _choose(client, embeddings_connection)

    removed = client.post(f"/admin/connections/{embeddings_connection.id}/remove", follow_redirects=True)
    assert "Search by meaning uses it: choose another embedding model first." in removed.text

    client.post("/admin/connections/embeddings", data={"embedding_choice": "default|"})
    account = _account(ada.account_id)
    assert (account.embedding_choice, account.embedding_searched) == (None, None)
    _run_background_jobs(app)  # the queued run finds nothing to change
    assert _models("memory", memory.id) == {"fake-embedder"}
    assert client.post(f"/admin/connections/{embeddings_connection.id}/remove").status_code == 303
