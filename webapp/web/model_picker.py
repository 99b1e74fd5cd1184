"""The one picker of a model: every connection of the account with the models it lists, grouped, plus any model
id typed in (checked against its connection when that one lists its models). The agent form and the account's
background model use it.

A picked option's value is "<connection ref>|<model id>" ("environment|gpt-4o-mini", "3|llama3.2:3b"); an
option "<ref>|" means "another model at this connection", typed in the text field beside the picker.
"""

import time
from dataclasses import dataclass

from flask import current_app

from webapp.llm import providers, targets
from webapp.models import Agent
from webapp.models.connections import AnyConnection, account_connections

ENVIRONMENT_LISTING_SECONDS = 60  # the environment's provider is asked for its models at most this often


@dataclass
class Group:
    connection: AnyConnection
    models: list[str]


@dataclass
class Picked:
    connection: AnyConnection
    model: str

    @property
    def connection_id(self) -> int | None:
        return self.connection.id


class NotListed(ValueError):
    """A typed model id that its connection does not list (the message says so)."""


def value(connection: AnyConnection, model: str) -> str:
    return f"{connection.key}|{model}"


def groups(account_id: int) -> list[Group]:
    """Each connection the account may use (the environment's first) with the models it lists."""
    environment = targets.environment_connection(listed=True)
    return [
        Group(environment, _environment_models(environment)),
        *(Group(c, c.model_ids) for c in account_connections(account_id)),
    ]


def choices(groups: list[Group]) -> dict[str, list[tuple[str, str]]]:
    """The picker's options, grouped by connection: its models, then "another model" there."""
    return {
        group.connection.name: [
            *((value(group.connection, model), model) for model in group.models),
            (value(group.connection, ""), f"Another model at {group.connection.name} (type its id)"),
        ]
        for group in groups
    }


def pick(account_id: int, picked: str | None, typed: str | None) -> Picked:
    """The connection and model of a picker's value, or of its text field when an id is typed there (at the
    picked option's connection); NotListed when a connection added in the app lists models and not this one, or it names
    no connection of the account (the environment's provider takes any id, as before connections)."""
    key, _, model = (picked or "").partition("|")
    connection = targets.connection_in(account_id, key)
    if connection is None:
        raise NotListed("Pick a connection of this account.")
    # An id typed in wins (the page clears the field when a listed model is picked: webapp/static/cairn.js).
    model = (typed or "").strip() or model.strip()
    if not model:
        raise NotListed(f"Pick a model of {connection.name}, or type its id.")
    # The environment's provider takes any id, as before connections (its list is a suggestion).
    listed = connection.model_ids if connection.id else []
    if listed and model not in listed:
        raise NotListed(
            f"{connection.name} does not list the model '{model}': pick one of its {len(listed)} models, or "
            "refresh its list on the Connections page."
        )
    return Picked(connection, model)


def _environment_models(environment: AnyConnection) -> list[str]:
    """The environment's models: those that run here, or what LLM_BASE_URL lists (asked at most once a minute
    per process; none when it cannot be reached, and any id typed in is then taken)."""
    if environment.models:
        return environment.model_ids
    cache = current_app.extensions.setdefault("environment_models", {})
    if time.monotonic() - cache.get("at", float("-inf")) > ENVIRONMENT_LISTING_SECONDS:
        try:
            cache["models"] = [m["id"] for m in providers.list_models(environment)]
        except providers.ProviderError:
            cache["models"] = []
        cache["at"] = time.monotonic()
    return cache["models"]


def on_bundled_model(agents: list[Agent]) -> list[str]:
    """The names of these agents that run on the tiny bundled model (the environment's, with no LLM_BASE_URL)."""
    if not current_app.config["LOCAL_LLM"]:
        return []
    return [agent.name for agent in agents if agent.connection_id is None]


OLLAMA_DETECTION_SECONDS = 30  # OLLAMA_BASE_URL is asked at most this often per process


def detected_ollama(account_id: int) -> list[str] | None:
    """The models of an Ollama answering at OLLAMA_BASE_URL, when no connection of the account has its address
    yet (None otherwise, or when none answers there)."""
    address = current_app.config["OLLAMA_BASE_URL"].rstrip("/")
    if any(c.base_url.removesuffix("/v1") == address for c in account_connections(account_id)):
        return None
    cache = current_app.extensions.setdefault("detected_ollama", {})
    at, models = cache.get(address, (float("-inf"), None))
    if time.monotonic() - at > OLLAMA_DETECTION_SECONDS:
        models = providers.detect_ollama(address)
        cache[address] = (time.monotonic(), models)
    return models
