import functools
import hashlib
import secrets
from datetime import datetime
from typing import Any, NamedTuple

import sqlalchemy as sa
from flask import current_app
from flask_login import UserMixin
from itsdangerous import BadData, URLSafeTimedSerializer
from sqlalchemy.orm import Mapped, mapped_column, relationship
from werkzeug.security import check_password_hash, generate_password_hash
from zxcvbn import zxcvbn

from webapp.extensions import db
from webapp.timeutil import utcnow

ROLES = ("admin", "member")
PASSWORD_MIN_CHARS = 8
PASSWORD_MAX_CHARS = 200
MAX_NAME_CHARS = 60
INVITE_DAYS = 7  # how long a sign-in link for a new person works (once)
SIGN_IN_LINK_MINUTES = 15  # how long a one-time sign-in link from `flask users link` works
# A password_hash starting with this is no password at all: an invited person who has not chosen one yet. What
# follows it changes with every new sign-in link, which voids the links made before.
NO_PASSWORD = "!"


class PersonName(NamedTuple):
    """All a member may know of another person of the account: who they are called."""

    id: int
    name: str


class PersonChangeRefused(ValueError):
    """A change to a person that an admin may not make: to their own role or account, or one that would leave
    the account without an admin."""


class Account(db.Model):
    __tablename__ = "accounts"

    id: Mapped[int] = mapped_column(primary_key=True)
    name: Mapped[str] = mapped_column(sa.String(120))
    # The model its agents' memory jobs use (a cheaper one, say), at a connection (None: the environment's);
    # no model: each agent's own (webapp.llm.targets.for_background).
    background_connection_id: Mapped[int | None] = mapped_column(
        sa.ForeignKey(
            "connections.id", use_alter=True, name="fk_accounts_background_connection_id_connections"
        )
    )
    background_model_id: Mapped[str | None] = mapped_column(sa.String(200))
    # The embedder of its memories and messages, as "<ref>|<model>" (webapp.search.embedder.resolve): a model at a
    # connection, "bundled|" (all-MiniLM-L6-v2, run here) or None: the environment's EMBEDDING_* settings, as before.
    embedding_choice: Mapped[str | None] = mapped_column(sa.String(300))
    # While the chosen embedder's vectors are being written, the choice whose vectors search still ranks by (never
    # a mix of two models); None once they are all written (webapp.jobs.embeddings.embed_for_new_model).
    embedding_searched: Mapped[str | None] = mapped_column(sa.String(300))
    created_at: Mapped[datetime] = mapped_column(default=utcnow)

    users: Mapped[list["User"]] = relationship(back_populates="account")

    @property
    def account_id(self) -> int:
        """Its own id, as a job about an account is recorded under it (webapp.jobs.runs.JobKind.account_of)."""
        return self.id

    def people_names(self) -> list[PersonName]:
        """The account's people who are not removed, by name (to add them to a chat): no e-mail, no role."""
        rows = db.session.execute(
            sa.select(User.id, User.name, User.email).where(User.active_in(self.id)).order_by(User.id)
        )
        people = [PersonName(id, name or email.split("@")[0]) for id, name, email in rows]
        return sorted(people, key=lambda person: person.name.casefold())


class User(UserMixin, db.Model):
    __tablename__ = "users"

    id: Mapped[int] = mapped_column(primary_key=True)
    account_id: Mapped[int] = mapped_column(sa.ForeignKey("accounts.id"), index=True)
    email: Mapped[str] = mapped_column(sa.String(254), unique=True)
    # The name others see on this person's messages (and agents in their prompts); None: the e-mail's local part.
    name: Mapped[str | None] = mapped_column(sa.String(MAX_NAME_CHARS))
    password_hash: Mapped[str] = mapped_column(sa.String(255))
    role: Mapped[str] = mapped_column(
        sa.Enum(*ROLES, name="user_role", native_enum=False, create_constraint=True), default="member"
    )
    created_at: Mapped[datetime] = mapped_column(default=utcnow)
    # Removed from the account by an admin: cannot sign in; their private chats are kept (for export), unseen.
    removed_at: Mapped[datetime | None]
    # The person's own setting: their temporary chats are deleted for good this many days after their last
    # message (None: kept until they delete them).
    temporary_chat_days: Mapped[int | None]
    # The person at the team's identity provider (webapp.web.oidc), linked at their first sign-in through it: a
    # changed e-mail there keeps the link.
    oidc_issuer: Mapped[str | None] = mapped_column(sa.String(255))
    oidc_subject: Mapped[str | None] = mapped_column(sa.String(255))
    # The digest of the one-time sign-in link `flask users link` printed, until it is used.
    sign_in_link_hash: Mapped[str | None] = mapped_column(sa.String(64))

    account: Mapped[Account] = relationship(back_populates="users")
    __table_args__ = (sa.UniqueConstraint("oidc_issuer", "oidc_subject"),)

    # The sign-in this user object was loaded for (not a column): Flask-Login keeps it in the session and
    # remember-me cookies as the user's id, so ending the sign-in server-side makes every copy worthless.
    session_token = None  # str while the user is signed in through it

    # One object per row in a session: plain identity, not UserMixin's comparison of Flask-Login ids.
    __eq__ = object.__eq__
    __ne__ = object.__ne__
    __hash__ = object.__hash__

    @property
    def is_admin(self) -> bool:
        return self.role == "admin"

    @property
    def is_removed(self) -> bool:
        return self.removed_at is not None

    @property
    def has_password(self) -> bool:
        """False for an invited person who has not chosen a password yet."""
        return bool(self.password_hash) and not self.password_hash.startswith(NO_PASSWORD)

    @classmethod
    def active_in(cls, account_id: int) -> sa.ColumnElement[bool]:
        """Condition on User: the people of the account who have not been removed from it."""
        return sa.and_(cls.account_id == account_id, cls.removed_at.is_(None))

    @property
    def display_name(self) -> str:
        """The name the person chose, or else their e-mail's local part."""
        return self.name or self.email.split("@")[0]

    def set_password(self, password: str) -> None:
        self.password_hash = generate_password_hash(password)

    def check_password(self, password: str) -> bool:
        if not self.has_password:  # no password matches, at the cost of checking one
            check_password_hash(_unknown_user_hash(), password)
            return False
        return check_password_hash(self.password_hash, password)

    @classmethod
    def authenticate(cls, email: str, password: str) -> "User | None":
        """The user with this email and password, at the same hashing cost whether the email exists or not; a
        removed person is not found."""
        user = db.session.scalar(
            sa.select(cls).where(cls.email == email.strip().lower(), cls.removed_at.is_(None))
        )
        if user is None:
            check_password_hash(_unknown_user_hash(), password)
            return None
        return user if user.check_password(password) else None

    def get_id(self) -> str:
        """Flask-Login's id for this user: the token of the sign-in, never the database id."""
        if self.session_token is None:
            raise RuntimeError("start_session() before signing the user in")
        return self.session_token

    def start_session(self) -> None:
        """Begin a new sign-in of this user (call before login_user); its expired sign-ins are removed."""
        oldest = utcnow() - current_app.config["REMEMBER_COOKIE_DURATION"]
        db.session.execute(
            sa.delete(UserSession).where(UserSession.user_id == self.id, UserSession.created_at <= oldest)
        )
        self.session_token = secrets.token_urlsafe(32)
        db.session.add(UserSession(user=self, token_hash=_digest(self.session_token)))

    def end_session(self) -> None:
        """End this sign-in: its session and remember-me cookies, and any copies of them, stop working."""
        db.session.execute(
            sa.delete(UserSession).where(UserSession.token_hash == _digest(self.session_token))
        )

    def end_all_sessions(self) -> None:
        """End every sign-in of this user, on every device (after a password change)."""
        db.session.execute(sa.delete(UserSession).where(UserSession.user_id == self.id))

    @classmethod
    def for_session(cls, token: str) -> "User | None":
        """The user of a live sign-in with this token (Flask-Login's user loader), else None.

        A sign-in lasts as long as its remember-me cookie at most, whatever a client does with that cookie."""
        oldest = utcnow() - current_app.config["REMEMBER_COOKIE_DURATION"]
        user = db.session.scalar(
            sa.select(cls)
            .join(UserSession, UserSession.user_id == cls.id)
            .where(UserSession.token_hash == _digest(token), UserSession.created_at > oldest)
            .where(cls.removed_at.is_(None))
        )
        if user is not None:
            user.session_token = token
        return user

    def invite(self) -> str:
        """A new sign-in link's token for choosing a password: it works once, for INVITE_DAYS, and only while
        the person has no password; any earlier link stops working."""
        if self.has_password:
            raise PersonChangeRefused(f"{self.display_name} has chosen a password already.")
        self.password_hash = NO_PASSWORD + secrets.token_urlsafe(16)
        db.session.flush()  # the id the token names
        return _invites().dumps([self.id, _digest(self.password_hash)])

    @classmethod
    def for_invite(cls, token: str) -> "User | None":
        """The person a sign-in link was made for, while it still works (not used, replaced, expired or its
        person removed), else None."""
        try:
            user_id, fingerprint = _invites().loads(token, max_age=INVITE_DAYS * 24 * 3600)
        except (BadData, TypeError, ValueError):
            return None
        user = db.session.scalar(sa.select(cls).where(cls.id == user_id, cls.removed_at.is_(None)))
        if user is None or user.has_password or _digest(user.password_hash) != fingerprint:
            return None
        return user

    def accept_invite(self, password: str) -> bool:
        """Set the password of a person found by for_invite; False if their link was used (or replaced) since.
        The update is conditional, so two uses of one link at the same moment cannot both succeed."""
        done = db.session.execute(
            sa.update(User)
            .where(User.id == self.id, User.password_hash == self.password_hash)
            .values(password_hash=generate_password_hash(password))
        )
        db.session.refresh(self)
        return done.rowcount == 1

    def sign_in_link(self) -> str:
        """A token that signs this person in once, within SIGN_IN_LINK_MINUTES, without a password (for an admin
        when passwords are off: OIDC_ONLY); a newer one replaces it."""
        secret = secrets.token_urlsafe(16)
        self.sign_in_link_hash = _digest(secret)
        db.session.flush()  # the id the token names
        return _sign_in_links().dumps([self.id, secret])

    @classmethod
    def use_sign_in_link(cls, token: str, *, peek: bool = False) -> "User | None":
        """The person of a sign-in link that still works; unless peeking, the link then stops working (the
        conditional update lets one of two uses at the same moment through)."""
        try:
            user_id, secret = _sign_in_links().loads(token, max_age=SIGN_IN_LINK_MINUTES * 60)
        except (BadData, TypeError, ValueError):
            return None
        unused = sa.and_(
            cls.id == user_id, cls.sign_in_link_hash == _digest(secret), cls.removed_at.is_(None)
        )
        if peek:
            return db.session.scalar(sa.select(cls).where(unused))
        done = db.session.execute(sa.update(cls).where(unused).values(sign_in_link_hash=None))
        return db.session.get(cls, user_id) if done.rowcount == 1 else None

    def change_role(self, role: str, *, by: "User | None") -> None:
        """Make this person an admin or a member; `by` (the admin acting; None: the command line) cannot change
        their own role, and the account keeps an admin."""
        if role not in ROLES:
            raise ValueError(f"unknown role {role!r}")
        if role == self.role:
            return
        if by is self:
            raise PersonChangeRefused("You cannot change your own role; another admin can.")
        self._keep_an_admin(role=role)

    def remove(self, *, by: "User | None") -> None:
        """Take this person out of the account: each of their sign-ins ends now and no new one starts. Nothing
        of theirs is deleted (their private chats are kept, unseen by others)."""
        if by is self:
            raise PersonChangeRefused("You cannot remove yourself; another admin can.")
        if self.is_removed:
            return
        self._keep_an_admin(removed_at=utcnow())
        self.end_all_sessions()
        # Restoring them later revives neither: they get a new sign-in link, and make new keys.
        for key in getattr(self, "api_keys", []):  # ApiKey.user's backref (webapp.models.api_keys)
            key.revoked_at = key.revoked_at or utcnow()
        self.sign_in_link_hash = None
        if not self.has_password:
            self.password_hash = NO_PASSWORD + secrets.token_urlsafe(16)  # the link they had stops working

    def restore(self) -> None:
        """Take a removed person back: they sign in as before with their password (an invited one needs a new
        sign-in link; their API keys stay revoked)."""
        self.removed_at = None

    def _keep_an_admin(self, **change: Any) -> None:
        """Make the change (a role, a removal) unless it would take away the account's last admin, which is
        refused. Two admins demoting or removing each other at the same moment cannot both succeed: the check is
        inside the one UPDATE that makes the change, which SQLite runs holding its write lock, and PostgreSQL
        after the account's row is locked (its UPDATE reads only what was committed when it started)."""
        if not self.is_admin or self.is_removed:
            for name, value in change.items():
                setattr(self, name, value)
            return
        db.session.execute(sa.select(Account.id).where(Account.id == self.account_id).with_for_update())
        other = sa.orm.aliased(User)
        other_admins = (
            sa.select(sa.func.count())
            .select_from(other)
            .where(
                other.account_id == self.account_id,
                other.removed_at.is_(None),
                other.role == "admin",
                other.id != self.id,
            )
            .scalar_subquery()
        )
        change_unless_last = sa.update(User).where(User.id == self.id, other_admins > 0).values(**change)
        done = db.session.execute(change_unless_last, execution_options={"synchronize_session": "fetch"})
        if done.rowcount != 1:
            raise PersonChangeRefused(
                f"{self.display_name} is the account's only admin: make someone else an admin first."
            )


class UserSession(db.Model):
    """One sign-in. Its cookies carry a token whose hash is here; deleting the row signs that sign-in out."""

    __tablename__ = "user_sessions"

    id: Mapped[int] = mapped_column(primary_key=True)
    user_id: Mapped[int] = mapped_column(sa.ForeignKey("users.id"), index=True)
    token_hash: Mapped[str] = mapped_column(sa.String(64), unique=True)
    created_at: Mapped[datetime] = mapped_column(default=utcnow)

    user: Mapped[User] = relationship()


def _digest(token: str | None) -> str:
    return hashlib.sha256((token or "").encode()).hexdigest()


def _invites() -> URLSafeTimedSerializer:
    return URLSafeTimedSerializer(current_app.config["SECRET_KEY"], salt="cairn-invite")


def _sign_in_links() -> URLSafeTimedSerializer:
    return URLSafeTimedSerializer(current_app.config["SECRET_KEY"], salt="cairn-sign-in-link")


@functools.cache
def _unknown_user_hash() -> str:
    """A hash made like every user's, to check passwords against when no user has the email."""
    return generate_password_hash(secrets.token_hex(16))


def password_problem(password: str, email: str = "") -> str | None:
    """Why this password is refused (whitespace only, too short or long, common or easy to guess), or None."""
    if not password.strip():
        return "A password cannot be only spaces."
    if len(password) < PASSWORD_MIN_CHARS:
        return f"A password needs at least {PASSWORD_MIN_CHARS} characters."
    if len(password) > PASSWORD_MAX_CHARS:
        return f"A password has at most {PASSWORD_MAX_CHARS} characters."
    verdict = zxcvbn(password, user_inputs=[email, email.split("@")[0], "cairn"])
    if verdict["score"] >= 2:
        return None
    warning = verdict["feedback"]["warning"] or "It is too close to common words, names or your email."
    advice = " ".join(verdict["feedback"]["suggestions"]) or "Use a few uncommon words together."
    return f"That password is too easy to guess. {warning} {advice}"
