"""Small builders for test data."""

from webapp.extensions import db
from webapp.models import Account, Agent, AgentMemory, Chat, ChatAgent, Message, User

PASSWORD = "correct horse battery"


def account(name: str = "Acme") -> Account:
    row = Account(name=name)
    db.session.add(row)
    db.session.commit()
    return row


def user(acct: Account, email: str = "dana@example.com", role: str = "admin") -> User:
    row = User(account=acct, email=email, role=role)
    row.set_password(PASSWORD)
    db.session.add(row)
    db.session.commit()
    return row


def agent(acct: Account, name: str = "Ada", **fields) -> Agent:
    fields.setdefault("model_id", f"{name.lower()}-model")
    fields.setdefault("enabled_tools", ["save_memory"])
    row = Agent(account=acct, name=name, **fields)
    db.session.add(row)
    db.session.commit()
    return row


def chat(acct: Account, agents: list[Agent], title: str = "", manual: bool | None = None) -> Chat:
    row = Chat(
        account_id=acct.id, title=title, manual_responses=len(agents) > 1 if manual is None else manual
    )
    row.chat_agents = [ChatAgent(agent=a) for a in agents]
    db.session.add(row)
    db.session.commit()
    return row


def message(chat_row: Chat, content: str, *, author: User | Agent | None = None, **fields) -> Message:
    if isinstance(author, Agent):
        fields.update(role="assistant", agent=author)
    else:
        fields.update(role=fields.get("role", "user"), user=author)
    row = chat_row.add_message(content=content, status=fields.pop("status", "done"), **fields)
    db.session.commit()
    return row


def memory(agent_row: Agent, content: str, memory_type: str = "core", **fields) -> AgentMemory:
    row = AgentMemory(agent_id=agent_row.id, content=content, memory_type=memory_type, **fields)
    db.session.add(row)
    db.session.commit()
    return row
