"""Background jobs: one module per job; queue.py records, queues and locks their runs, schedule.py times them.

Jobs are plain functions that take ids."""

import importlib
import pkgutil


def load_all() -> None:
    """Import every job module, so each recorded job type is in webapp.jobs.queue.JOB_TYPES."""
    for module in pkgutil.iter_modules(__path__):
        importlib.import_module(f"{__name__}.{module.name}")
