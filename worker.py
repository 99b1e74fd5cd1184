"""An RQ worker that runs every job inside the Flask app context: `python worker.py [--burst]`."""

import sys

import sqlalchemy as sa
from flask import Flask
from openai.types.chat import ChatCompletion, ChatCompletionChunk
from rq import Worker

from webapp import config, create_app, jobs, prompts, tokens
from webapp.extensions import db
from webapp.queue import redis_connection, rq_queue, wait_for_redis


class AppWorker(Worker):
    """Runs each job (in its forked work horse) inside a fresh app context."""

    app = None

    def perform_job(self, job, queue, execution):
        with self.app.app_context():
            try:
                return super().perform_job(job, queue, execution)
            finally:
                db.session.remove()


def preload(app: Flask) -> None:
    """Load once, in the parent, what every job would otherwise load again in its freshly forked work horse:
    the tokenizer (over a second), the job modules, the prompt templates, the model client's API classes and
    response validators, and the ORM mappers. Nothing here opens a connection, which a fork must not share."""
    tokens.encoder()
    jobs.load_all()
    prompts.compile_all()
    _ = app.extensions["llm_client"].chat.completions  # the openai SDK imports its resources on first use
    for response_type in (ChatCompletion, ChatCompletionChunk):  # pydantic builds validators on first use
        response_type.model_rebuild(force=True)
    sa.orm.configure_mappers()


def main(argv: list[str]) -> None:
    try:
        app = create_app()
    except config.ConfigError as error:
        raise SystemExit(f"Cairn cannot start: {error}") from None
    AppWorker.app = app
    preload(app)
    with app.app_context():
        wait_for_redis()
        worker = AppWorker([rq_queue()], connection=redis_connection())
    worker.work(burst="--burst" in argv, with_scheduler=True)


if __name__ == "__main__":
    main(sys.argv)
