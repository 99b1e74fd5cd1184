"""Which model a request goes to, and what follows from it.

An agent names a connection (webapp.models.connections) and a model; a ModelTarget is the two together, with
everything a request needs: where to send it, with which key, and the window it must fit. Every model-dependent
setting (the input budget, the answer's room, a memory job's chunk size, how many requests at once) is read from
the target, never from whether an environment variable is set.
"""

from dataclasses import dataclass, field

from flask import current_app

from webapp import config
from webapp.extensions import db
from webapp.local_models.catalog import installed_models, not_installed
from webapp.models import Account, Agent
from webapp.models.connections import (
    ENVIRONMENT,
    AnyConnection,
    Connection,
    EnvironmentConnection,
)

DEFAULT_INPUT_CAP = 24_000  # a request's input when PROMPT_TOKEN_BUDGET is unset and the window allows more
CONSOLIDATION_CHUNK_CAP = 100_000  # what one extraction reads at most, whatever the window
COMPACTION_INPUT_CAP = 50_000  # what one compaction summary reads at most
# Ollama serves a model with this window unless its server is told otherwise (OLLAMA_CONTEXT_LENGTH): a longer
# request is cut silently, so a model's own, larger, window is not what it gets.
OLLAMA_DEFAULT_CONTEXT_TOKENS = 4096
# Requests one worker process sends at once to a connection: the server Cairn runs itself answers one at a time,
# so more would only queue there (and time out).
LOCAL_CONCURRENCY = 1


@dataclass(frozen=True)
class ModelTarget:
    """A model at a connection: where a request goes and the window it must fit."""

    connection_id: int | None
    connection_name: str
    kind: str  # webapp.models.connections.KINDS
    base_url: str  # the OpenAI-compatible root (…/v1)
    api_key: str = field(repr=False)  # never in a log line or a traceback's locals
    headers: tuple[tuple[str, str], ...] = field(repr=False)
    model: str
    context_tokens: int | None  # the model's window, when the provider or an admin said

    @property
    def counts_as_local(self) -> bool:
        """Whether requests are counted as the local server renders them (webapp.prompting.window): with
        SmolLM2's tokenizer, which counts more than the larger vocabularies of the models it may download."""
        return self.kind == "local"

    def unavailable(self) -> str | None:
        """Why no request can go to this model, in words: a model that runs here, on a machine without the local
        model server (the `local-llm` extra); None otherwise."""
        if self.kind != "local" or not (missing := not_installed()):
            return None
        return (
            f"{missing} Until then the model '{self.model}' cannot answer: an admin can give the agent a model at "
            "another connection (Admin, Connections), or set LLM_BASE_URL."
        )

    def max_output_tokens(self) -> int | None:
        """max_tokens for each request: LLM_MAX_OUTPUT_TOKENS, or for a model that runs here the answer's room
        (a small model may ramble until its window is full); else the provider's own limit."""
        setting = current_app.config.get("LLM_MAX_OUTPUT_TOKENS")
        if setting:
            return setting
        return config.LOCAL_MODEL_MAX_OUTPUT_TOKENS if self.kind == "local" else None

    def answer_room(self) -> int:
        return self.max_output_tokens() or config.ANSWER_RESERVE_TOKENS

    def input_budget(self) -> int:
        """The tokens a request's messages and tool schemas may take: PROMPT_TOKEN_BUDGET (24,000 unset), and
        never more than the model's window leaves once the answer has its room."""
        budget = current_app.config.get("PROMPT_TOKEN_BUDGET") or DEFAULT_INPUT_CAP
        if self.context_tokens:
            budget = min(budget, max(self.context_tokens - self.answer_room(), 1))
        return budget

    def chunk_tokens(self, setting: str, cap: int, *, beside: int | None = None) -> int:
        """What one memory-job request reads (CONSOLIDATION_CHUNK_TOKENS, COMPACTION_MAX_INPUT_TOKENS): the
        setting when set, else a share of what the model's window leaves once the answer has its room, up to
        cap; cap when the window is unknown. With `beside` (the tokens of the request's other parts: its
        instructions and the most the memory it lists may take), all the room they leave, in a tokenizer that
        counts half as much again (the local model's); else a third of it (room for both)."""
        if setting_value := current_app.config.get(setting):
            return setting_value
        if not self.context_tokens:
            return cap
        room = self.context_tokens - self.answer_room()
        return min(cap, max(room * 2 // 3 - beside if beside is not None else room // 3, 1))

    def concurrency(self) -> int:
        """Requests one worker process sends to this connection at once."""
        if self.kind == "local":
            return LOCAL_CONCURRENCY
        return current_app.config["CONNECTION_CONCURRENCY"]


def environment_connection(*, listed: bool = False) -> EnvironmentConnection:
    """The environment's provider, as the settings say now: LLM_BASE_URL, or with none the models that run here
    (listed: with the models installed here, which a request does not need: each is served with the same
    window)."""
    settings = current_app.config
    if settings["LOCAL_LLM"]:
        models = local_models() if listed else []
        return EnvironmentConnection("local", settings["LLM_BASE_URL"], settings["LLM_API_KEY"], models)
    return EnvironmentConnection("openai", settings["LLM_BASE_URL"], settings["LLM_API_KEY"])


def local_models() -> list[dict]:
    """The models the server Cairn runs itself serves: the bundled SmolLM2, then those downloaded."""
    bundled = {"id": config.LOCAL_MODEL_ID, "context_tokens": config.LOCAL_MODEL_CONTEXT_TOKENS}
    downloaded = installed_models(current_app.instance_path, bundled=False)
    return [bundled, *({"id": m.name, "context_tokens": m.context_tokens} for m in downloaded)]


def connection_in(account_id: int, key: str | int | None) -> AnyConnection | None:
    """The connection of this ref in the account ("environment" or empty: the environment's; else a row's id),
    or None when the account has no such connection."""
    if key in (None, "", ENVIRONMENT):
        return environment_connection()
    try:
        row = db.session.get(Connection, int(key))
    except (TypeError, ValueError):
        return None
    return row if row is not None and row.account_id == account_id else None


def connection_of(agent: Agent) -> AnyConnection:
    """The agent's connection (the environment's when it names none)."""
    return connection_in(agent.account_id, agent.connection_id) or environment_connection()


def target(connection: AnyConnection, model: str) -> ModelTarget:
    """The model at this connection, with its window: an admin's setting, else what the provider listed, else
    (for an Ollama) the window Ollama serves with by default."""
    context = connection.setting(model, "context_tokens") or connection.listed_context_tokens(model)
    if connection.kind == "local":  # the server that runs here gives every model the same window
        context = context or config.LOCAL_MODEL_CONTEXT_TOKENS
    if connection.kind == "ollama":
        context = connection.setting(model, "context_tokens") or min(
            context or OLLAMA_DEFAULT_CONTEXT_TOKENS, OLLAMA_DEFAULT_CONTEXT_TOKENS
        )
    return ModelTarget(
        connection_id=connection.id,
        connection_name=connection.name,
        kind=connection.kind,
        base_url=openai_root(connection),
        api_key=connection.api_key or "none",
        headers=tuple(sorted(connection.headers.items())),
        model=model,
        context_tokens=context,
    )


def openai_root(connection: AnyConnection) -> str:
    """Where the connection answers OpenAI-compatible requests: an Ollama server on /v1 under its own root."""
    base = connection.base_url.rstrip("/")
    if connection.kind == "ollama" and not base.endswith("/v1"):
        return f"{base}/v1"
    return base


def for_agent(agent: Agent) -> ModelTarget:
    """Where the agent's replies go: its own connection and model."""
    return target(connection_of(agent), agent.model_id)


def for_background(agent: Agent) -> ModelTarget:
    """Where the agent's memory jobs go (consolidation, reflection, refinement, summaries, compaction): the
    account's background model when its admins set one (a cheaper one, say), else the agent's own."""
    account: Account = agent.account
    if account.background_model_id:
        connection = connection_in(account.id, account.background_connection_id)
        if connection is not None:
            return target(connection, account.background_model_id)
    return for_agent(agent)


def for_environment(model: str) -> ModelTarget:
    """A model of the environment's connection (SUMMARY_MODEL_ID, COMPACTION_MODEL_ID name one)."""
    return target(environment_connection(), model)
