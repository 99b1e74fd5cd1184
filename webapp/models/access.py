"""Who may read a chat, and who may hear what came from one: the one rule every route, search, prompt, summary
and job goes through. Each function returns SQL conditions, so the rule runs inside the query that reads the
rows: a page, a budget or a top-k is never filled with rows that are then dropped.

A chat is *private* to its people (who started it and who was added) or *shared* with everyone of its account.
What came from a chat (its messages, the agents' summaries of it, the memories made from it) may be heard only
where everyone present may read that chat. Present in a private chat: its people; in a shared chat: anyone of
the account, so there only what everyone may read is heard. A person added to a chat hears what it holds, as
they can read it; a chat made shared makes its memories heard account-wide, and made private again narrows them
back. Memories with the audience "everyone" (an admin's entries, or widened by one) are heard everywhere.

Nobody reads, through any path, words that came from a chat they may not read. A reply may quote what its prompt
held from other chats (recalled or borrowed messages, their summaries, memories made from them), all of which
everyone present could read then. So a chat is never widened (shared, a person added, a removed person
restored) to anyone who may not read every chat its replies drew on (`sources_closed_to`): what the chat holds,
and the memories and summaries made from it, which are heard only where the chat may be read, stay with people
who could read where they came from.
"""

from collections.abc import Iterable, Sequence
from dataclasses import dataclass

import sqlalchemy as sa

from webapp.extensions import DATABASE_ID_MAX, db
from webapp.models.accounts import User
from webapp.models.chats import Chat, ChatPerson, Message
from webapp.models.memories import AgentMemory, ReplySources


def people_of(chat: Chat) -> list[int]:
    """The ids of a chat's people, in the order they joined; a person removed from the account is no one."""
    return list(
        db.session.scalars(
            sa.select(ChatPerson.user_id)
            .join(User, User.id == ChatPerson.user_id)
            .where(ChatPerson.chat_id == chat.id, User.removed_at.is_(None))
            .order_by(ChatPerson.created_at)
        )
    )


def may_govern(chat: Chat, user: User) -> bool:
    """Whether the person may rename, discard or restore the chat, share it or make it private and add or take
    out people: its people; for a chat from before chats had people (none), everyone of the account reads it and
    only an admin governs it."""
    return governs(people_of(chat), user)


def governs(people: Sequence[int], user: User) -> bool:
    """may_govern, for a chat whose people (ids) are already known."""
    return user.id in people if people else user.is_admin


def governed_among(user: User, chat_ids: Sequence[int]) -> set[int]:
    """Those of these chats the person governs (governs, in SQL): one query, none without ids."""
    if not chat_ids:
        return set()
    theirs = sa.exists().where(ChatPerson.chat_id == Chat.id, ChatPerson.user_id == user.id)
    nobodys = ~sa.exists().where(
        ChatPerson.chat_id == Chat.id, ChatPerson.user_id == User.id, User.removed_at.is_(None)
    )
    rule = sa.or_(theirs, nobodys) if user.is_admin else theirs
    return set(db.session.scalars(sa.select(Chat.id).where(Chat.id.in_(chat_ids), rule)))


def present(chat: Chat) -> list[int] | None:
    """Who may be listening in a chat: the ids of a private chat's people; None for a shared chat (anyone of
    the account)."""
    return people_of(chat) if chat.is_private else None


def chats_read_by(account_id: int, people: Sequence[int] | None) -> sa.ColumnElement[bool]:
    """Condition on Chat: the chats of the account that every one of `people` may read (None: anyone of the
    account, so the shared chats only). No people: no chat."""
    shared = Chat.visibility == "shared"
    if people is None:
        return sa.and_(Chat.account_id == account_id, shared)
    if not people:
        return sa.false()
    each_a_person = [
        sa.exists().where(ChatPerson.chat_id == Chat.id, ChatPerson.user_id == person) for person in people
    ]
    return sa.and_(Chat.account_id == account_id, sa.or_(shared, sa.and_(*each_a_person)))


def readable_chats(user: User) -> sa.ColumnElement[bool]:
    """Condition on Chat: the chats this person may read (admins too: they manage agents and memory, they do not
    read other people's private chats)."""
    return chats_readable_by(user.id, user.account_id)


def chats_readable_by(user_id: int, account_id: int) -> sa.ColumnElement[bool]:
    """readable_chats by the person's ids: none once they are removed from the account, asked of the database
    each time, so a stream or a request that loaded the person before their removal reads nothing after it."""
    still_here = sa.exists().where(User.id == user_id, User.removed_at.is_(None))
    return sa.and_(still_here, chats_read_by(account_id, [user_id]))


def chats_of_person(user: User) -> sa.ColumnElement[bool]:
    """Condition on Chat: the chats the person is one of the people of (started, or was added to), and may read
    (what "What agents remember of me" and its download call theirs)."""
    theirs = sa.select(ChatPerson.chat_id).where(ChatPerson.user_id == user.id)
    return sa.and_(Chat.id.in_(theirs), readable_chats(user))


def readable_among(user: User, chat_ids: Iterable[int | None]) -> set[int]:
    """Those of these chat ids the person may read (one query; none without ids): whatever names or links another
    chat for someone (a page, a chip, a reply's sources, an export, a refusal) asks this first."""
    wanted = {i for i in chat_ids if i is not None and 0 < i <= DATABASE_ID_MAX}
    if not wanted:
        return set()
    return set(db.session.scalars(sa.select(Chat.id).where(Chat.id.in_(wanted), readable_chats(user))))


def may_read(user_id: int, account_id: int, chat_id: int) -> bool:
    """Whether the person may read this chat now (one query)."""
    query = sa.select(Chat.id).where(Chat.id == chat_id, chats_readable_by(user_id, account_id))
    return db.session.scalar(query) is not None


def chats_heard_in(chat: Chat) -> sa.ColumnElement[bool]:
    """Condition on Chat: the chats whose words may be used in `chat`: itself, and the chats that remember (not
    temporary ones) that everyone present there may read."""
    return sa.or_(Chat.id == chat.id, sa.and_(remembered(), chats_read_by(chat.account_id, present(chat))))


def remembered() -> sa.ColumnElement[bool]:
    """Condition on Chat: not a temporary chat. A temporary chat's words are heard in it alone: no memory,
    summary, borrow, recall or search elsewhere reads it."""
    return Chat.remembers.is_(True)


def chats_searched_by(user: User) -> sa.ColumnElement[bool]:
    """Condition on Chat: the chats whose messages a person's client (MCP, outside any chat) searches: those
    they may read, less the temporary ones."""
    return sa.and_(readable_chats(user), remembered())


def memories_heard(chats: sa.ColumnElement[bool]) -> sa.ColumnElement[bool]:
    """Condition on AgentMemory: the memories for everyone, and those from the chats that `chats` (a condition on
    Chat) admits."""
    return memories_heard_from(AgentMemory.chat_id.in_(sa.select(Chat.id).where(chats)))


def memories_heard_from(from_chats: sa.ColumnElement[bool]) -> sa.ColumnElement[bool]:
    """Condition on AgentMemory: the memories for everyone, and those whose chat `from_chats` (a condition on
    AgentMemory.chat_id: a query of the chats heard, or memory_chats_heard's ids bound when run) admits."""
    return sa.or_(AgentMemory.audience == "everyone", from_chats)


def memory_chats_heard(agent_id: int, chats: sa.ColumnElement[bool]) -> sa.Select:
    """Query: the ids of the chats that `chats` (a condition on Chat) admits and that the agent's active memories
    heard only there came from. With memories_heard_from, they admit what memories_heard(chats) does of the
    agent's, as ids a statement built once is given when run (webapp.models.memory_budget.memories_within).
    The database reads whichever side is smaller: the agent's memories' chats, or the chats admitted."""
    from_memories = (
        sa.select(AgentMemory.chat_id)
        .distinct()
        .where(AgentMemory.agent_id == agent_id, AgentMemory.is_active, AgentMemory.audience == "chat")
    )
    return sa.select(Chat.id).where(Chat.id.in_(from_memories), chats)


def joined_ids(query: sa.Select) -> sa.ScalarSelect:
    """A query of ids as one text value, "5,1,9" (NULL when none), for a statement that reads other columns too;
    split_ids reads it."""
    ids = query.subquery()
    return sa.select(sa.func.aggregate_strings(sa.cast(ids.c[0], sa.String), ",")).scalar_subquery()


def split_ids(text: str | None) -> list[int]:
    """The ids of a joined_ids value, in order."""
    return sorted(int(i) for i in text.split(",")) if text else []


def memories_heard_in(chat: Chat) -> sa.ColumnElement[bool]:
    """Condition on AgentMemory: what an agent may use in `chat` (its prompt, recall, the member memory view)."""
    return memories_heard(chats_heard_in(chat))


def memories_heard_by(user: User) -> sa.ColumnElement[bool]:
    """Condition on AgentMemory: what this person may hear outside any chat (a client of the API or MCP)."""
    return memories_heard(readable_chats(user))


def memories_forgettable_by(user: User) -> sa.ColumnElement[bool]:
    """Condition on AgentMemory: the memories this person may forget (soft-delete, audited as them): an admin any;
    a member those that came from a chat they are one of the people of (not a shared chat they only read), never
    one heard by everyone. (A constitutional memory is refused by the model, whoever asks.)"""
    if user.is_admin:
        return sa.true()
    theirs = sa.select(ChatPerson.chat_id).where(ChatPerson.user_id == user.id)
    return sa.and_(
        AgentMemory.audience == "chat",
        AgentMemory.chat_id.in_(theirs),
        AgentMemory.chat_id.in_(sa.select(Chat.id).where(readable_chats(user))),
    )


@dataclass(frozen=True)
class Audience:
    """Who hears a memory: everyone of the account (chat_id None), or whoever may read one chat. The memory jobs
    that read several memories and write from them (reflection, refinement) work within one audience at a time,
    so nothing read in one is written where another is heard."""

    chat_id: int | None = None

    @classmethod
    def of(cls, memory: AgentMemory) -> "Audience":
        return cls(memory.chat_id if memory.audience == "chat" else None)

    def holds(self) -> sa.ColumnElement[bool]:
        """Condition on AgentMemory: the memories heard by exactly these people."""
        if self.chat_id is None:
            return AgentMemory.audience == "everyone"
        return sa.and_(AgentMemory.audience == "chat", AgentMemory.chat_id == self.chat_id)

    def columns(self) -> dict[str, str | int | None]:
        """The columns a memory written for this audience gets."""
        return {"audience": "everyone" if self.chat_id is None else "chat", "chat_id": self.chat_id}


EVERYONE = Audience()


def audiences_of(memories: Iterable[AgentMemory]) -> dict[Audience, list[AgentMemory]]:
    """The memories by audience, each audience in the order its first memory came."""
    grouped: dict[Audience, list[AgentMemory]] = {}
    for memory in memories:
        grouped.setdefault(Audience.of(memory), []).append(memory)
    return grouped


def same_audience(first: AgentMemory, second: AgentMemory) -> bool:
    """Two memories may become one (reflection, refinement) only when the same people may hear them."""
    return Audience.of(first) == Audience.of(second)


IDS_PER_QUERY = 10_000


def drawn_on(chat: Chat) -> set[int]:
    """The ids of the other chats whose words reached this chat's replies: recalled or borrowed from, listed by
    their summaries, or heard through a memory made from them (two queries, for up to IDS_PER_QUERY memories)."""
    chat_ids: set[int] = set()
    memory_ids: set[int] = set()
    for recalled, summarized, borrowed, held, recalled_memories in db.session.execute(
        sa.select(
            ReplySources.recalled_chat_ids,
            ReplySources.summary_chat_ids,
            ReplySources.borrowed_chat_id,
            ReplySources.memory_ids,
            ReplySources.recalled_memory_ids,
        )
        .join(Message, Message.id == ReplySources.message_id)
        .where(Message.chat_id == chat.id)
    ):
        chat_ids.update(recalled or [], summarized or [], [borrowed] if borrowed else [])
        memory_ids.update(held or [], recalled_memories or [])
    ids = sorted(memory_ids)
    for start in range(0, len(ids), IDS_PER_QUERY):  # within SQLite's limit of bound parameters
        part = ids[start : start + IDS_PER_QUERY]
        query = sa.select(AgentMemory.chat_id).where(AgentMemory.id.in_(part), AgentMemory.audience == "chat")
        chat_ids.update(db.session.scalars(query))
    chat_ids.discard(chat.id)
    return chat_ids


def sources_closed_to(chat: Chat, people: Sequence[int] | None) -> list[Chat]:
    """The chats this chat's replies drew on that not all of `people` (None: everyone of the account) may read:
    while there is one, the chat may not be widened to them."""
    drawn = drawn_on(chat)
    if not drawn:
        return []
    readable = sa.select(Chat.id).where(chats_read_by(chat.account_id, people))
    return list(
        db.session.scalars(
            sa.select(Chat).where(Chat.id.in_(drawn), Chat.id.not_in(readable)).order_by(Chat.id)
        )
    )


@dataclass(frozen=True)
class ChatNames:
    """How chats are named to one person (the rule that follows readable_among): a chat they may read by its
    title, any other with its title withheld (None), for the caller to say "a private chat" or whose it is. Pages,
    run lists, refusals and exports name chats through this. `readable` None: every chat (the command line)."""

    readable: set[int] | None

    @classmethod
    def among(cls, user: User | None, chat_ids: Iterable[int | None]) -> "ChatNames":
        """For these chat ids (one query; none for the command line, `user` None)."""
        return cls(None if user is None else readable_among(user, chat_ids))

    @classmethod
    def loading(cls, user: User, query: sa.Select) -> tuple[list[Chat], "ChatNames"]:
        """The chats a query selects and how they are named to the person, in that one query."""
        rows = db.session.execute(query.add_columns(sa.case((readable_chats(user), True), else_=False))).all()
        return [chat for chat, _ in rows], cls({chat.id for chat, readable in rows if readable})

    def may_name(self, chat_id: int | None) -> bool:
        return self.readable is None or chat_id in self.readable

    def title(self, chat: Chat) -> str | None:
        """The title this person sees (display_title), or None when it is withheld from them."""
        return chat.display_title if self.may_name(chat.id) else None


def named_for(chats: Sequence[Chat], user: User) -> str:
    """These chats as the person may see them named: the titles of those they may read, and how many others."""
    if not chats:
        return ""
    names = ChatNames.among(user, [chat.id for chat in chats])
    titles = [f"“{title}”" for chat in chats if (title := names.title(chat)) is not None]
    unseen = len(chats) - len(titles)
    if unseen:
        titles.append("a chat you cannot read" if unseen == 1 else f"{unseen} chats you cannot read")
    return ", ".join(titles[:-1]) + " and " + titles[-1] if len(titles) > 1 else titles[0]


def drawn_beyond(user: User) -> list[Chat]:
    """The chats of this person (back in the account, or about to be) whose replies drew on a chat they may not
    read, as happens while they were away: they are no longer to be among its people."""
    theirs = db.session.scalars(
        sa.select(Chat).join(ChatPerson, ChatPerson.chat_id == Chat.id).where(ChatPerson.user_id == user.id)
    ).all()
    return [chat for chat in theirs if sources_closed_to(chat, [*people_of(chat), user.id])]
