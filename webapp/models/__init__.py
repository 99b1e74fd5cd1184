"""The data and its verbs: one module per aggregate (memory scopes, the audit trail), importable from here.

access.py is the one rule of who may read a chat, hear a memory, govern a chat and see a chat named."""

from webapp.models.accounts import Account, User, UserSession
from webapp.models.agents import Agent
from webapp.models.api_keys import ApiKey
from webapp.models.audit import AuditLog
from webapp.models.chats import Chat, ChatAgent, ChatHidden, ChatPerson, Message
from webapp.models.connections import Connection
from webapp.models.memories import AgentMemory, MemorySource, ReplySources
from webapp.models.memory_changes import ProposedChange
from webapp.models.proposals import MemoryProposal
from webapp.models.runs import JobRun, LlmCall
from webapp.models.search import EmbeddingQueue, SearchTableStats, SearchTermStats
from webapp.models.tool_servers import ToolServer

__all__ = [
    "Account",
    "Agent",
    "AgentMemory",
    "ApiKey",
    "AuditLog",
    "Chat",
    "ChatAgent",
    "ChatHidden",
    "ChatPerson",
    "Connection",
    "EmbeddingQueue",
    "JobRun",
    "LlmCall",
    "MemoryProposal",
    "MemorySource",
    "Message",
    "ProposedChange",
    "ReplySources",
    "SearchTableStats",
    "SearchTermStats",
    "ToolServer",
    "User",
    "UserSession",
]
