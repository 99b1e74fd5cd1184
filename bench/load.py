"""Chat under load, as README's Production section runs it: gunicorn (2 workers x 8 threads) for pages, gunicorn
(gevent) for live streams, 2 RQ workers (each running WORKER_THREADS jobs at once), PostgreSQL, redis-server, and
a model that waits 300 ms before its first token.

    .venv/bin/python -m bench.load [USERS ...] [--seconds 60] [--threads 4]   # default: 5 and 50 users

Each simulated user holds its chat's live stream open, sends a message, waits for the reply to arrive on the
stream, loads the chat page and the chat list, thinks 1-3 s, and again. Printed for each number of users:
post-to-first-token and post-to-reply p50/p95, page p95, errors, replies per second against the ceiling of
workers / model latency (what workers answering one reply at a time could reach) and against the users' own
pace, the reply job's own time above its model calls, and after the queue drains, the
messages lost (acknowledged but not stored, or never answered), duplicated and stuck.
"""

import argparse
import random
import re
import threading
import time
from collections import Counter
from dataclasses import dataclass, field

import httpx2 as httpx  # the HTTP client the openai SDK brings
import sqlalchemy as sa

from bench.load_stack import percentile, running_stack, seed_users, signed_in_client
from webapp.extensions import db
from webapp.models import JobRun, LlmCall, Message

MODEL_LATENCY = 0.3
RQ_WORKERS = 2
MEAN_THINK_SECONDS = 2  # each user waits 1-3 s between a reply and its next message
REPLY_TIMEOUT = 180


@dataclass
class Figures:
    first_token: list[float] = field(default_factory=list)
    reply: list[float] = field(default_factory=list)
    pages: list[float] = field(default_factory=list)
    errors: Counter = field(default_factory=Counter)
    sent: list[str] = field(default_factory=list)  # contents acknowledged with HTTP 200
    lock: threading.Lock = field(default_factory=threading.Lock)

    def add(self, name: str, value: float) -> None:
        with self.lock:
            getattr(self, name).append(value)

    def error(self, what: str) -> None:
        with self.lock:
            self.errors[what] += 1


class StreamWatcher:
    """Reads one chat's Server-Sent Events in a thread: when each reply's first delta and final event came."""

    def __init__(self, client: httpx.Client, chat_id: int):
        self.first_delta: dict[int, float] = {}
        self.final: dict[int, tuple[float, str]] = {}
        self.connected = threading.Event()
        self.changed = threading.Condition()
        self._client, self._chat_id = client, chat_id
        threading.Thread(target=self._read, daemon=True).start()

    def _read(self) -> None:
        event, data = None, []
        with self._client.stream("GET", f"/chats/{self._chat_id}/stream", timeout=None) as response:
            for line in response.iter_lines():
                if line.startswith(": connected"):
                    self.connected.set()
                elif line.startswith("event: "):
                    event = line.removeprefix("event: ")
                elif line.startswith("data: "):
                    data.append(line)
                elif not line and event:  # a blank line ends the event
                    self._seen(event, "\n".join(data))
                    event, data = None, []

    def _seen(self, event: str, data: str) -> None:
        kind, _, message_id = event.partition("-")
        if kind not in ("delta", "final"):
            return  # "message": a new message of the chat, shown to its other pages
        now = time.perf_counter()
        with self.changed:
            if kind == "delta":
                self.first_delta.setdefault(int(message_id), now)
            else:
                status = re.search(r'class="message assistant (\w+)"', data)
                self.final[int(message_id)] = (now, status.group(1) if status else "?")
            self.changed.notify_all()

    def wait_final(self, message_id: int, timeout: float) -> tuple[float, str] | None:
        deadline = time.perf_counter() + timeout
        with self.changed:
            while self.final.get(message_id, (0, "pending"))[1] in ("pending", "streaming"):
                if not self.changed.wait(max(0.0, deadline - time.perf_counter())):
                    return None
            return self.final[message_id]


def simulate_user(n: int, email: str, chat_id: int, stack, figures: Figures, stop_at: float) -> None:
    pages = signed_in_client(stack.pages, email)
    streams = httpx.Client(base_url=stack.streams, cookies=pages.cookies, timeout=30)
    watcher = StreamWatcher(streams, chat_id)
    if not watcher.connected.wait(30):
        figures.error("stream did not connect")
        return
    sequence = 0
    while time.perf_counter() < stop_at:
        sequence += 1
        content = f"user {n} message {sequence}"
        started = time.perf_counter()
        try:
            response = pages.post(f"/chats/{chat_id}/messages", data={"content": content})
        except httpx.HTTPError as error:  # e.g. a kept-alive connection the server closed meanwhile
            figures.error(f"post {type(error).__name__}")
            continue
        if response.status_code != 200:
            figures.error(f"post HTTP {response.status_code}")
            continue
        figures.sent.append(content)
        reply_id = int(re.findall(r'id="message-(\d+)" class="message assistant', response.text)[-1])
        final = watcher.wait_final(reply_id, REPLY_TIMEOUT)
        if final is None or final[1] != "done":
            figures.error(f"reply {final[1] if final else 'not seen within timeout'}")
        else:
            figures.add("reply", final[0] - started)
            if reply_id in watcher.first_delta:
                figures.add("first_token", watcher.first_delta[reply_id] - started)
        for path in (f"/chats/{chat_id}", "/chats/"):
            figures.add("pages", _timed_get(pages, path, figures))
        time.sleep(random.uniform(1, 3))


def _timed_get(client: httpx.Client, path: str, figures: Figures) -> float:
    started = time.perf_counter()
    try:
        status = client.get(path).status_code
    except httpx.HTTPError as error:
        status = type(error).__name__
    if status != 200:
        figures.error(f"page {status}")
    return time.perf_counter() - started


def audit(sent: list[str], since_message_id: int) -> dict[str, int]:
    """After the queue drained: lost, duplicated and stuck messages of this run, from the database."""
    rows = db.session.execute(
        sa.select(Message.id, Message.chat_id, Message.role, Message.content, Message.status)
        .where(Message.id > since_message_id)
        .order_by(Message.chat_id, Message.id)
    ).all()
    contents = Counter(r.content for r in rows if r.role == "user")
    answers: Counter = Counter()
    last_user: dict[int, str] = {}
    for r in rows:
        if r.role == "user":
            last_user[r.chat_id] = r.content
        elif r.role == "assistant" and r.status == "done":
            answers[last_user.get(r.chat_id)] += 1
    return {
        "lost": sum(1 for c in sent if contents[c] == 0 or answers[c] == 0),
        "duplicated": sum(n - 1 for n in contents.values() if n > 1)
        + sum(n - 1 for n in answers.values() if n > 1),
        "stuck": sum(1 for r in rows if r.role == "assistant" and r.status in ("pending", "streaming")),
        "failed": sum(1 for r in rows if r.role == "assistant" and r.status == "failed"),
    }


def job_overhead_ms(since_run_id: int) -> list[float]:
    """Each reply job's time in job_runs minus the time of its own model calls."""
    runs = db.session.execute(
        sa.select(JobRun.id, JobRun.started_at, JobRun.finished_at).where(
            JobRun.id > since_run_id, JobRun.job_type == "reply", JobRun.status == "done"
        )
    ).all()
    model = dict(
        db.session.execute(
            sa.select(LlmCall.job_run_id, sa.func.sum(LlmCall.latency_ms))
            .where(LlmCall.job_run_id > since_run_id)
            .group_by(LlmCall.job_run_id)
        ).all()
    )
    return [(r.finished_at - r.started_at).total_seconds() * 1000 - (model.get(r.id) or 0) for r in runs]


def queue_wait_ms(since_run_id: int) -> list[float]:
    """Each reply's wait from its post (the reply placeholder's creation) to the start of its job's run."""
    runs = db.session.execute(
        sa.select(JobRun.args, JobRun.started_at).where(
            JobRun.id > since_run_id, JobRun.job_type == "reply", JobRun.status == "done"
        )
    ).all()
    first_ids = [r.args[0][0] for r in runs]
    posted = dict(
        db.session.execute(sa.select(Message.id, Message.created_at).where(Message.id.in_(first_ids))).all()
    )
    return [(r.started_at - posted[r.args[0][0]]).total_seconds() * 1000 for r in runs]


def summary_runs(since_run_id: int) -> dict[str, int]:
    """Summary runs of this run: all, the ones that found the summary fresh (a duplicate queued while another
    was waiting would), and the model calls they made."""
    runs = db.session.scalars(
        sa.select(JobRun).where(JobRun.id > since_run_id, JobRun.job_type == "summarize")
    ).all()
    calls = db.session.scalar(
        sa.select(sa.func.count())
        .select_from(LlmCall)
        .where(LlmCall.job_run_id > since_run_id, LlmCall.purpose == "summarize")
    )
    fresh = sum(1 for r in runs if (r.counts or {}).get("fresh"))
    return {"runs": len(runs), "fresh": fresh, "calls": calls}


def drain(seconds: float = 120) -> None:
    deadline = time.monotonic() + seconds
    while time.monotonic() < deadline:
        db.session.rollback()
        pending = db.session.scalar(
            sa.select(sa.func.count())
            .select_from(Message)
            .where(Message.status.in_(("pending", "streaming")))
        )
        if not pending:
            return
        time.sleep(1)


def run(stack, users: int, seconds: float, threads: int) -> None:
    since_message = db.session.scalar(sa.select(sa.func.coalesce(sa.func.max(Message.id), 0)))
    since_run = db.session.scalar(sa.select(sa.func.coalesce(sa.func.max(JobRun.id), 0)))
    accounts = seed_users(users, f"load{users}u")
    figures = Figures()
    stop_at = time.perf_counter() + seconds
    simulated = [
        threading.Thread(target=simulate_user, args=(n, email, chat_id, stack, figures, stop_at), daemon=True)
        for n, (email, chat_id) in enumerate(accounts)
    ]
    started = time.perf_counter()
    for user in simulated:
        user.start()
    for user in simulated:
        user.join(seconds + REPLY_TIMEOUT + 30)
    elapsed = time.perf_counter() - started
    drain()
    _print(users, threads, figures, elapsed, audit(figures.sent, since_message), job_overhead_ms(since_run))
    waits = queue_wait_ms(since_run)
    print(
        f"  post-to-job-start (queue wait)  p50 {percentile(waits, 50):,.0f} ms  p95 {percentile(waits, 95):,.0f} ms"
    )
    print(
        "  summary runs {runs}, of which found the summary fresh {fresh}; summary model calls {calls}".format(
            **summary_runs(since_run)
        )
    )


def _ms(values: list[float], pct: float) -> str:
    return f"{percentile(values, pct) * 1000:,.0f} ms"


def _print(
    users: int, threads: int, figures: Figures, elapsed: float, counts: dict[str, int], overhead: list[float]
) -> None:
    ceiling = RQ_WORKERS / MODEL_LATENCY
    throughput = len(figures.reply) / elapsed
    per_visit = MEAN_THINK_SECONDS + percentile(figures.reply, 50) + 2 * percentile(figures.pages, 50)
    users_pace = users / per_visit  # what the users would send if every reply came at its median time
    print(
        f"\n{users} users, {elapsed:.0f} s, {len(figures.sent)} messages acknowledged, {len(figures.reply)} replies seen"
    )
    print(
        f"  post-to-first-token  p50 {_ms(figures.first_token, 50):>9}  p95 {_ms(figures.first_token, 95):>9}"
    )
    print(f"  post-to-reply        p50 {_ms(figures.reply, 50):>9}  p95 {_ms(figures.reply, 95):>9}")
    print(
        f"  page (chat, list)    p50 {_ms(figures.pages, 50):>9}  p95 {_ms(figures.pages, 95):>9}  ({len(figures.pages)} loads)"
    )
    print(
        f"  reply job overhead above its model calls  p50 {percentile(overhead, 50):,.0f} ms  p95 {percentile(overhead, 95):,.0f} ms"
    )
    print(
        f"  replies/s {throughput:.2f} = {throughput / ceiling:.0%} of workers/latency {ceiling:.2f}"
        f" ({RQ_WORKERS} workers of {threads} threads; the users' own pace at these reply times: {users_pace:.2f}/s)"
    )
    print(f"  errors {sum(figures.errors.values())} {dict(figures.errors) or ''}")
    print(
        f"  lost {counts['lost']}  duplicated {counts['duplicated']}  stuck {counts['stuck']}  failed {counts['failed']}"
    )


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("users", nargs="*", type=int, default=[5, 50])
    parser.add_argument("--seconds", type=float, default=60)
    parser.add_argument(
        "--threads", type=int, default=4, help="WORKER_THREADS: jobs each worker runs at once"
    )
    args = parser.parse_args()
    extra_env = {
        "RATE_LIMIT_REPLIES": "100000 per minute",
        "STREAM_MAX_PER_USER": "4",
        "WORKER_THREADS": str(args.threads),
    }
    with running_stack(rq_workers=RQ_WORKERS, model_latency=MODEL_LATENCY, extra_env=extra_env) as stack:
        for users in args.users:
            run(stack, users, args.seconds, args.threads)


if __name__ == "__main__":
    main()
