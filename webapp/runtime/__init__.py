"""The processes of `make run`: how each starts (processes), who restarts them (supervisor), whether each answers.

health.py's probes serve `flask check`, /healthz and the pages' banner; priority.py lets a process's background
work step aside while one of its replies builds its prompt."""

import gc


def set_loaded_aside() -> None:
    """Set what the process has loaded so far aside from garbage collection (gc.freeze), once started: it lives as
    long as the process, and each full collection walked its 194,000 objects, 130 to 180 ms at a random moment of
    some reply or request (bench.recall's p95; 0.1 ms frozen). Garbage is collected first, so none is kept."""
    gc.collect()
    gc.freeze()
