"""The admin area: one blueprint under /admin, its pages one module each and common.py what they share.

Each agent's memory ledger, the audit log, refinement sessions and their proposals for review, provenance, run
now, the usage and jobs pages, and the tool servers (Tools)."""

from webapp.admin import (  # noqa: F401  (their routes join bp)
    audit,
    connections,
    ledger,
    local_models,
    proposals,
    provenance,
    runs,
    sessions,
    tool_servers,
    usage,
)
from webapp.admin.common import bp

__all__ = ["bp"]
