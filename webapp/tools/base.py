from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

from webapp.models import Agent, Chat, Message


@dataclass
class ToolContext:
    """What a reply's tool may act on: the agent whose reply is running, in this chat, for this message."""

    agent: Agent
    chat: Chat
    message: Message


@dataclass(frozen=True)
class Tool:
    name: str
    description: str  # written for the model
    parameters: dict[str, Any]  # JSON schema of the arguments, checked before run is called
    run: Callable[..., dict[str, Any]]  # run(context, **arguments) -> JSON-able result
    in_replies: bool = True  # an agent may enable it for its replies (else only its own job offers it)

    def schema(self) -> dict[str, Any]:
        return {
            "type": "function",
            "function": {"name": self.name, "description": self.description, "parameters": self.parameters},
        }
