"""Review (issue 23): the proposals of staged refinement sessions, each change shown as a diff, and one form that
decides a whole proposal: the ticked changes are applied (each rechecked against the memory as it is now), the
rest rejected. The admin navigation shows how many proposals wait."""

from dataclasses import dataclass
from typing import Any

import sqlalchemy as sa
from flask import abort, flash, redirect, render_template, request, url_for
from flask.typing import ResponseReturnValue
from flask_login import current_user
from flask_wtf import FlaskForm
from sqlalchemy.orm import selectinload

from webapp.admin.common import bp
from webapp.admin.entries import word_diff
from webapp.admin.provenance import chat_labels
from webapp.extensions import db
from webapp.models import AgentMemory, MemoryProposal, ProposedChange
from webapp.models.memories import core_token_usage
from webapp.models.memory_changes import session_limits
from webapp.models.proposals import ProposalRefused, outcome_words, pending, pending_count
from webapp.timeutil import utcnow
from webapp.web.auth import admin_required

VIA = "review"
RECENT = 20  # decided and expired proposals listed under the pending ones


class DecisionForm(FlaskForm):
    """The decision's CSRF token; the ticked change ids come as `apply`, the button as `decision`."""


@dataclass
class Review:
    """One change as the review page shows it: what it changes, into what, and whether it still applies."""

    change: ProposedChange
    problem: str | None  # pending: why it would be stale now; decided: why it was
    now: dict[int, AgentMemory]

    @property
    def parts(self) -> list[dict[str, Any]]:
        """Each memory it changes as it was when proposed, with its id."""
        return [{"id": i, **self.change.before(i)} for i in self.change.memory_ids]

    @property
    def diff(self) -> list[tuple[str, str]] | None:
        """A rewrite's word diff (a merge shows its parts and the merged text apart)."""
        if self.change.kind != "rewrite":
            return None
        return word_diff(self.parts[0]["content"], self.change.content or "")

    @property
    def tokens(self) -> str:
        """The change's own difference in core tokens, and where it comes from (not the core memory's total)."""
        change = self.change
        moved = change.tokens_after - change.tokens_before
        difference = f"{'+' if moved > 0 else '−' if moved else '±'}{abs(moved):,} tokens"
        held = f"{change.tokens_before:,}"
        if change.kind == "merge":
            parts = (
                f"its {len(change.memory_ids)} memories hold {held}, the merged one {change.tokens_after:,}"
            )
        elif change.kind == "rewrite":
            parts = f"the memory holds {held}, rewritten {change.tokens_after:,}"
        else:
            one = len(change.memory_ids) == 1
            parts = f"the {'memory' if one else 'memories'} it deletes {'holds' if one else 'hold'} {held}"
        return f"This change: {difference} ({parts})"

    @property
    def title(self) -> str:
        change, ids = self.change, ", ".join(f"#{i}" for i in self.change.memory_ids)
        if change.kind == "merge":
            return f"Merge {len(change.memory_ids)} memories ({ids}) into one"
        if change.kind == "rewrite":
            return f"Rewrite {ids}"
        if change.duplicate_of:
            return f"Delete {ids}, an exact copy of #{change.duplicate_of}"
        return f"Delete {ids}"


def _to_review() -> tuple[int, str]:
    """How many proposals of the account wait, and where the number links: the one, or the list."""
    count, first = pending_count(current_user.account_id, utcnow())
    url = url_for("admin.proposal", proposal_id=first) if count == 1 else url_for("admin.proposals")
    return count, url


@bp.app_context_processor
def _review_count() -> dict[str, Any]:
    return {"proposals_to_review": _to_review}


def _account_proposals() -> sa.Select:
    return (
        sa.select(MemoryProposal)
        .where(MemoryProposal.account_id == current_user.account_id)
        .options(selectinload(MemoryProposal.agent), selectinload(MemoryProposal.changes))
    )


@bp.get("/proposals")
@admin_required
def proposals() -> ResponseReturnValue:
    """Proposals waiting for review, oldest first; then the latest decided or expired ones."""
    now = utcnow()
    waiting = db.session.scalars(_account_proposals().where(pending(now)).order_by(MemoryProposal.id)).all()
    done = db.session.scalars(
        _account_proposals().where(~pending(now)).order_by(MemoryProposal.id.desc()).limit(RECENT)
    ).all()
    return render_template("memories/proposals.html", waiting=waiting, done=done, now=now)


def _proposal_or_404(proposal_id: int) -> MemoryProposal:
    proposal = db.session.scalar(_account_proposals().where(MemoryProposal.id == proposal_id))
    if proposal is None:
        abort(404)
    return proposal


def _review_context(proposal: MemoryProposal, **extra: Any) -> dict[str, Any]:
    now = utcnow()
    problems = proposal.problems() if proposal.is_pending(now) else {}
    memories = proposal.memories()
    reviews = [
        Review(change, problems.get(change.id) or change.stale_reason, memories)
        for change in proposal.changes
    ]
    usage = core_token_usage(proposal.agent_id)
    applicable = sum(r.change.saves for r in reviews if not r.problem)
    context = dict(proposal=proposal, agent=proposal.agent, reviews=reviews, now=now, form=DecisionForm())
    context["chats"] = chat_labels({m.chat_id for m in memories.values()} - {None})
    context.update(usage=usage, usage_after=usage - applicable, status=proposal.status_at(now))
    return context | extra


@bp.get("/proposals/<int:proposal_id>")
@admin_required
def proposal(proposal_id: int) -> ResponseReturnValue:
    """One proposal: each change as a diff, tokens against the budget, and the form that decides it."""
    return render_template("memories/proposal.html", **_review_context(_proposal_or_404(proposal_id)))


@bp.post("/proposals/<int:proposal_id>")
@admin_required
def decide(proposal_id: int) -> ResponseReturnValue:
    """Apply the ticked changes that still apply and reject the rest, in one transaction."""
    found, form = _proposal_or_404(proposal_id), DecisionForm()
    rejecting = request.form.get("decision") == "reject"
    chosen = set() if rejecting else {int(i) for i in request.form.getlist("apply") if i.isdecimal()}
    try:
        if not form.validate():
            raise ProposalRefused("The form expired; load the page again and decide once more.")
        outcome = found.decide(chosen, user_id=current_user.id, via=VIA, now=utcnow(), **session_limits())
    except ProposalRefused as refusal:
        db.session.rollback()
        context = _review_context(_proposal_or_404(proposal_id), error=str(refusal), chosen=chosen)
        return render_template("memories/proposal.html", **context), 422
    db.session.commit()
    flash(outcome_words(outcome))
    return redirect(url_for("admin.proposal", proposal_id=proposal_id), code=303)
