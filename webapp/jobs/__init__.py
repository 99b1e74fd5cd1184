"""Background jobs: one module per job, and the machinery that queues, records, recovers and times them.

queue.py queues, runs and locks them, runs.py records their runs, sweep.py recovers lost work, schedule.py times
them.

Jobs are plain functions that take ids."""

import importlib
import pkgutil


def load_all() -> None:
    """Import every job module, so each recorded job type is in webapp.jobs.runs.JOB_TYPES."""
    for module in pkgutil.iter_modules(__path__):
        importlib.import_module(f"{__name__}.{module.name}")
