"""Input tokens per reply as a chat grows, beside the tokens the full history would take.

    .venv/bin/python -m bench.prompt_tokens

For chats of 100, 1,000 and 10,000 messages: the chat is compacted as Cairn would (a fake model writes a
fixed-size summary), then the reply prompt is built. Prints figures; asserts nothing.
"""

import sqlalchemy as sa

from bench.common import bench_app
from tests import factories
from tests.fake_llm import FakeLLM
from webapp.extensions import db
from webapp.jobs.compaction import compact_chat
from webapp.models import Chat, Message
from webapp.prompting.build import build_prompt
from webapp.timeutil import utcnow
from webapp.tokens import count_tokens

SIZES = [100, 1_000, 10_000]
SUMMARY = "- " + "A fact the conversation settled about roses, shade and watering. " * 6


def _row(size: int, fake: FakeLLM) -> str:
    with bench_app() as app:
        app.config["LLM_BASE_URL"] = fake.base_url
        account = factories.account()
        user = factories.user(account)
        agent = factories.agent(account, "Ada")
        chat = factories.chat(account, [agent])
        now = utcnow()
        rows = [
            {"chat_id": chat.id, "role": "user", "user_id": user.id, "status": "done", "created_at": now,
             "updated_at": now, "content": f"Message {i}: what about roses in the shade of the old wall? " * 2}
            for i in range(size)
        ]  # fmt: skip
        db.session.execute(sa.insert(Message), rows)
        db.session.commit()
        full = sum(count_tokens(f"dana: {r['content']}") for r in rows)
        while compact_chat(chat.id).get("summarized"):  # what the worker does, a batch per job
            db.session.expire_all()
        db.session.expire_all()
        chat = db.session.get(Chat, chat.id)
        prompt = sum(count_tokens(m["content"]) for m in build_prompt(chat, agent).messages)
    return f"{size:>9,} | {prompt:>13,} | {full:>19,} | {prompt / full:>6.1%}"


def main() -> None:
    fake = FakeLLM()
    fake.default_text = SUMMARY
    try:
        print(f"{'messages':>9} | {'prompt tokens':>13} | {'full history tokens':>19} | {'ratio':>6}")
        for size in SIZES:
            print(_row(size, fake))
    finally:
        fake.close()


if __name__ == "__main__":
    main()
