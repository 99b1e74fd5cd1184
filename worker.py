"""An RQ worker that runs every job inside the Flask app context: `python worker.py [--burst]`."""

import sys

from rq import Worker

from webapp import create_app
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


def main(argv: list[str]) -> None:
    app = create_app()
    AppWorker.app = app
    with app.app_context():
        wait_for_redis()
        worker = AppWorker([rq_queue()], connection=redis_connection())
    worker.work(burst="--burst" in argv, with_scheduler=True)


if __name__ == "__main__":
    main(sys.argv)
