"""The memory ledger for admins: each agent's memories, every change to them, refinement sessions, run now."""

from flask import Blueprint

bp = Blueprint("memories", __name__, url_prefix="/admin")

from webapp.memories import audit, ledger, provenance, runs, sessions  # noqa: E402, F401  (their routes join bp)
