"""The people of an account (admins only): add one with a password or a sign-in link, change a role, remove
one and take them back. And the page a sign-in link opens, where a new person chooses their password."""

import secrets
from urllib.parse import quote

import sqlalchemy as sa
from flask import Blueprint, Response, current_app, flash, redirect, render_template, request, url_for
from flask.typing import ResponseReturnValue
from flask_limiter import RateLimitExceeded
from flask_login import current_user, login_user
from flask_wtf import FlaskForm
from wtforms import EmailField, PasswordField, RadioField, StringField
from wtforms.fields.choices import SelectChoice
from wtforms.validators import DataRequired, EqualTo, InputRequired, Length, Regexp, ValidationError

from webapp import limits
from webapp.actions import forgetting
from webapp.extensions import db, limiter
from webapp.models import User, access
from webapp.models.accounts import (
    INVITE_DAYS,
    MAX_NAME_CHARS,
    NO_PASSWORD,
    ROLES,
    PersonChangeRefused,
    password_problem,
)
from webapp.models.chats import ChatPerson
from webapp.web.auth import NameForm, admin_required, owned_or_404

bp = Blueprint("people", __name__)


class PersonForm(NameForm):
    name = StringField(
        "Name",
        validators=[Length(max=MAX_NAME_CHARS)],
    )
    email = EmailField(
        "E-mail",
        filters=[lambda text: (text or "").strip().lower()],
        validators=[
            DataRequired(),
            Length(max=254),
            Regexp(r"^[^@\s]+@[^@\s]+$", message="Enter an e-mail address, such as sam@example.com."),
        ],
    )
    role = RadioField(
        "Role",
        choices=[
            SelectChoice("member", "Member: chats with the agents"),
            SelectChoice("admin", "Admin: also manages agents, memory and people"),
        ],
        default="member",
    )
    password = PasswordField(
        "Password (optional)",
        render_kw={"autocomplete": "new-password"},
    )

    def validate_email(self, field: EmailField) -> None:
        if db.session.scalar(sa.select(User.id).where(User.email == field.data)):
            raise ValidationError("Someone already signs in with this e-mail.")

    def validate_password(self, field: PasswordField) -> None:
        if field.data and (problem := password_problem(field.data, self.email.data or "")):
            raise ValidationError(problem)


class WelcomeForm(FlaskForm):
    password = PasswordField(
        "Password", validators=[InputRequired()], render_kw={"autocomplete": "new-password"}
    )
    confirm = PasswordField(
        "Password again",
        validators=[InputRequired(), EqualTo("password", "The two passwords differ.")],
        render_kw={"autocomplete": "new-password"},
    )

    def __init__(self, person: User, *args, **kwargs):
        super().__init__(*args, **kwargs)
        self.person = person

    def validate_password(self, field: PasswordField) -> None:
        if problem := password_problem(field.data, self.person.email):
            raise ValidationError(problem)


@bp.get("/people/")
@admin_required
def index() -> ResponseReturnValue:
    """Everyone of the account: the people who may sign in first, then those removed."""
    return render_template("people/index.html", people=_people())


def _people() -> list[User]:
    return list(
        db.session.scalars(
            sa.select(User)
            .where(User.account_id == current_user.account_id)
            .order_by(
                User.removed_at.is_not(None), sa.func.lower(sa.func.coalesce(User.name, User.email)), User.id
            )
        )
    )


@bp.route("/people/new", methods=["GET", "POST"])
@admin_required
def new() -> ResponseReturnValue:
    """Add a person, with a password chosen now or with a sign-in link to pass on."""
    form = PersonForm()
    if form.validate_on_submit():
        person = User(account_id=current_user.account_id, email=form.email.data, role=form.role.data)
        person.name = " ".join((form.name.data or "").split()) or None
        db.session.add(person)
        if current_app.config["OIDC_ONLY"]:  # passwords are off: they sign in through the identity provider
            person.password_hash = NO_PASSWORD + secrets.token_urlsafe(16)
            db.session.commit()
            flash(
                f"{person.display_name} can now sign in with {current_app.config['OIDC_NAME']} as {person.email}."
            )
            return redirect(url_for("people.index"), code=303)
        if not form.password.data:
            return _link_page(person, new=True)
        person.set_password(form.password.data)
        db.session.commit()
        flash(f"{person.display_name} can now sign in as {person.email} with the password you chose.")
        return redirect(url_for("people.index"), code=303)
    return render_template("people/new.html", form=form), 422 if form.errors else 200


@bp.post("/people/<int:user_id>/link")
@admin_required
def link(user_id: int) -> ResponseReturnValue:
    """A new sign-in link for someone who has not chosen a password yet (earlier links stop working)."""
    person = owned_or_404(User, user_id)
    if person.is_removed:
        return _refused(f"{person.display_name} was removed: restore them first.")
    if person.has_password:
        return _refused(f"{person.display_name} has a password already: they sign in with it.")
    if current_app.config["OIDC_ONLY"]:
        return _refused(
            f"{person.display_name} signs in with {current_app.config['OIDC_NAME']}: passwords are off."
        )
    return _link_page(person, new=False)


def _link_page(person: User, new: bool) -> ResponseReturnValue:
    """The sign-in link, shown this once (it is kept nowhere: only its person's password state is)."""
    token = person.invite()
    db.session.commit()
    url = url_for("people.welcome", token=token, _external=True)
    html = render_template(
        "people/link.html", person=person, url=url, new=new, days=INVITE_DAYS, mailto=_mailto(person, url)
    )
    return _private(html, 200)


def _mailto(person: User, url: str) -> str:
    """An e-mail to the person with their sign-in link, for the admin's own mail app to send (RFC 6068)."""
    account = current_user.account.name
    lines = [
        f"Hello {person.display_name},",
        "",
        f"{current_user.display_name} added you to {account} on Cairn. Open this link to choose your password "
        "and sign in:",
        "",
        url,
        "",
        f"It works once, within {INVITE_DAYS} days. From then on you sign in as {person.email} with your password.",
    ]
    subject = f"Your sign-in link for {account} on Cairn"
    body = "\r\n".join(lines)
    return f"mailto:{quote(person.email, safe='@')}?subject={quote(subject)}&body={quote(body)}"


@bp.post("/people/<int:user_id>/role")
@admin_required
def role(user_id: int) -> ResponseReturnValue:
    """Make a person an admin or a member."""
    person = owned_or_404(User, user_id)
    chosen = request.form.get("role", "")
    if chosen not in ROLES or person.is_removed:
        return _refused("Choose admin or member for someone who has not been removed.")
    try:
        person.change_role(chosen, by=current_user._get_current_object())
    except PersonChangeRefused as refusal:
        return _refused(str(refusal))
    db.session.commit()
    flash(f"{person.display_name} is now {'an admin' if person.is_admin else 'a member'}.")
    return redirect(url_for("people.index"), code=303)


@bp.route("/people/<int:user_id>/remove", methods=["GET", "POST"])
@admin_required
def remove(user_id: int) -> ResponseReturnValue:
    """Ask, then remove a person: signed out everywhere at once, unable to sign in; their chats are kept."""
    person = owned_or_404(User, user_id)
    if request.method == "GET":
        learned = db.session.scalar(
            sa.select(sa.func.count()).select_from(forgetting.learned_only_from(person).subquery())
        )
        return render_template("people/remove.html", person=person, learned=learned)
    admin = current_user._get_current_object()
    try:
        person.remove(by=admin)
    except PersonChangeRefused as refusal:
        return _refused(str(refusal))
    said = ""
    if request.form.get("memories") == "forget":
        forgotten = forgetting.forget_learned_only_from(person, by=admin)
        said = f" Agents forgot {forgotten.count} memories learned only from their private chats (undo in the audit)."
    db.session.commit()
    flash(
        f"{person.display_name} was removed and signed out everywhere. Their chats are kept; nobody else sees them."
        + said
    )
    return redirect(url_for("people.index"), code=303)


@bp.post("/people/<int:user_id>/restore")
@admin_required
def restore(user_id: int) -> ResponseReturnValue:
    """Take a removed person back into the account, out of the chats that drew, while they were away, on a chat
    they may not read (access.drawn_beyond)."""
    person = owned_or_404(User, user_id)
    closed = access.drawn_beyond(person)
    db.session.execute(
        sa.delete(ChatPerson).where(
            ChatPerson.user_id == person.id, ChatPerson.chat_id.in_([c.id for c in closed])
        )
    )
    person.restore()
    db.session.commit()
    how = "with their password" if person.has_password else "once you make them a new sign-in link"
    if person.oidc_subject and person.oidc_issuer == current_app.config["OIDC_ISSUER"]:
        how = f"with {current_app.config['OIDC_NAME']}"
    left = (
        f" They left {len(closed)} of their chats, which drew on chats they may not read." if closed else ""
    )
    flash(f"{person.display_name} is back and can sign in {how}.{left}")
    return redirect(url_for("people.index"), code=303)


def _refused(text: str) -> ResponseReturnValue:
    """The people page again, saying why a change was not made."""
    return render_template("people/index.html", people=_people(), text=text), 409


def _failed(response: Response) -> bool:
    return response.status_code in (404, 422)


@bp.route("/welcome/<token>", methods=["GET", "POST"])
@limiter.limit(
    lambda: current_app.config["RATE_LIMIT_LOGIN_PER_ADDRESS"], key_func=limits.address_key,
    methods=["POST"], deduct_when=_failed, scope="welcome-address",
    error_message="Too many failed attempts.",
)  # fmt: skip
def welcome(token: str) -> ResponseReturnValue:
    """A sign-in link: its person chooses a password and is signed in; the link then stops working."""
    person = User.for_invite(token)
    if person is None:
        return _private(render_template("people/welcome.html", form=None), 404)
    form = WelcomeForm(person)
    if form.validate_on_submit():
        if not person.accept_invite(form.password.data):
            return _private(render_template("people/welcome.html", form=None), 404)
        if current_user.is_authenticated:  # someone else signed in on this browser: that sign-in ends
            current_user.end_session()
        person.start_session()
        db.session.commit()
        login_user(person, remember=True)
        flash(f"Welcome, {person.display_name}. From now on, sign in as {person.email} with your password.")
        return redirect(url_for("chats.index"), code=303)
    return _private(
        render_template("people/welcome.html", form=form, person=person), 422 if form.errors else 200
    )


@bp.errorhandler(RateLimitExceeded)
def _too_many_attempts(error: RateLimitExceeded) -> ResponseReturnValue:
    """The welcome page, saying why it refused."""
    response = _private(
        render_template("people/welcome.html", form=None, problem=limits.limit_message(error)), 429
    )
    response.headers["Retry-After"] = str(limits.seconds_until_allowed())
    return response


def _private(html: str, status: int) -> Response:
    """A page whose address holds a secret: not cached, and not sent on to other sites as a referrer."""
    response = Response(html, status=status)
    response.headers.update({"Cache-Control": "no-store", "Referrer-Policy": "no-referrer"})
    return response
