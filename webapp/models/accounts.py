import functools
import hashlib
import secrets
from datetime import datetime

import sqlalchemy as sa
from flask import current_app
from flask_login import UserMixin
from sqlalchemy.orm import Mapped, mapped_column, relationship
from werkzeug.security import check_password_hash, generate_password_hash
from zxcvbn import zxcvbn

from webapp.extensions import db
from webapp.timeutil import utcnow

ROLES = ("admin", "member")
PASSWORD_MIN_CHARS = 8
PASSWORD_MAX_CHARS = 200
MAX_NAME_CHARS = 60


class Account(db.Model):
    __tablename__ = "accounts"

    id: Mapped[int] = mapped_column(primary_key=True)
    name: Mapped[str] = mapped_column(sa.String(120))
    created_at: Mapped[datetime] = mapped_column(default=utcnow)

    users: Mapped[list["User"]] = relationship(back_populates="account")


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

    account: Mapped[Account] = relationship(back_populates="users")

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
    def display_name(self) -> str:
        """The name the person chose, or else their e-mail's local part."""
        return self.name or self.email.split("@")[0]

    def set_password(self, password: str) -> None:
        self.password_hash = generate_password_hash(password)

    def check_password(self, password: str) -> bool:
        return check_password_hash(self.password_hash, password)

    @classmethod
    def authenticate(cls, email: str, password: str) -> "User | None":
        """The user with this email and password, at the same hashing cost whether the email exists or not."""
        user = db.session.scalar(sa.select(cls).where(cls.email == email.strip().lower()))
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
        )
        if user is not None:
            user.session_token = token
        return user


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
