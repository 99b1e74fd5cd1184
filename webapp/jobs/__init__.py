"""Background jobs: one module per job family; plain functions that take ids and record their runs."""

import importlib
import pkgutil


def load_all() -> None:
    """Import every job module, so each recorded job type is in webapp.jobs.queue.JOB_TYPES."""
    for module in pkgutil.iter_modules(__path__):
        importlib.import_module(f"{__name__}.{module.name}")
