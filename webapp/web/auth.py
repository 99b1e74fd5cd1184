"""Sign-in and the access rules every view uses: signed in, within the user's account, admin where needed, and
only the chats the person may read (webapp.models.access)."""

import functools
from collections.abc import Callable
from typing import TypeVar
from urllib.parse import urlsplit

import sqlalchemy as sa
from flask import (
    Blueprint,
    Response,
    abort,
    current_app,
    flash,
    redirect,
    render_template,
    request,
    session,
    url_for,
)
from flask.typing import ResponseReturnValue
from flask_limiter import RateLimitExceeded
from flask_login import current_user, login_required, login_user, logout_user
from flask_wtf import FlaskForm
from wtforms import EmailField, PasswordField, StringField
from wtforms.validators import DataRequired, EqualTo, InputRequired, Length, ValidationError

from webapp import limits
from webapp.extensions import DATABASE_ID_MAX, db, limiter, login_manager
from webapp.models import Agent, ApiKey, Chat, User, access
from webapp.models.accounts import MAX_NAME_CHARS, password_problem
from webapp.models.api_keys import MAX_NAME_CHARS as MAX_KEY_NAME_CHARS

M = TypeVar("M", bound=db.Model)

bp = Blueprint("auth", __name__)

login_manager.login_view = "auth.login"
login_manager.login_message = "Please sign in to continue."


@login_manager.user_loader
def _load_user(session_token: str) -> User | None:
    """The user of a live sign-in; a signed-out or revoked one's cookies (and copies of them) load nobody."""
    return User.for_session(session_token)


class LoginForm(FlaskForm):
    email = EmailField("Email", validators=[DataRequired(), Length(max=254)])
    password = PasswordField("Password", validators=[DataRequired(), Length(max=200)])


class ApiKeyForm(FlaskForm):
    key_name = StringField(
        "Name of the new key",
        validators=[
            DataRequired("Name the key after the app or script that uses it."),
            Length(max=MAX_KEY_NAME_CHARS),
        ],
        render_kw={"placeholder": "e.g. Open WebUI on my laptop", "autocomplete": "off"},
    )


def _failed_sign_in(response: Response) -> bool:
    return response.status_code == 422


class PasswordForm(FlaskForm):
    current_password = PasswordField(
        "Current password",
        validators=[DataRequired(), Length(max=200)],
        render_kw={"autocomplete": "current-password"},
    )
    new_password = PasswordField(
        "New password", validators=[InputRequired()], render_kw={"autocomplete": "new-password"}
    )
    confirm = PasswordField(
        "New password again",
        validators=[InputRequired(), EqualTo("new_password", "The two new passwords differ.")],
        render_kw={"autocomplete": "new-password"},
    )

    def validate_current_password(self, field: PasswordField) -> None:
        if not current_user.check_password(field.data):
            raise ValidationError("That is not your current password.")

    def validate_new_password(self, field: PasswordField) -> None:
        if problem := password_problem(field.data, current_user.email):
            raise ValidationError(problem)


class NameForm(FlaskForm):
    name = StringField(
        "Your name, as others see it on your messages",
        validators=[Length(max=MAX_NAME_CHARS)],
        filters=[lambda text: " ".join((text or "").split())],  # absent from the post: empty
        render_kw={"autocomplete": "name"},
    )

    def validate_name(self, field: StringField) -> None:
        name = field.data or ""  # absent from the post (a form that names the field otherwise)
        agent = db.session.scalar(
            sa.select(Agent.name).where(
                Agent.account_id == current_user.account_id, sa.func.lower(Agent.name) == name.lower()
            )
        )
        if agent:
            raise ValidationError(f"{agent} is an agent's name; choose another.")


@bp.route("/login", methods=["GET", "POST"])
@limiter.limit(
    lambda: current_app.config["RATE_LIMIT_LOGIN_PER_ACCOUNT"], key_func=limits.login_email_key,
    methods=["POST"], deduct_when=_failed_sign_in, scope="login-account",
    error_message="Too many failed sign-in attempts.",
)  # fmt: skip
@limiter.limit(
    lambda: current_app.config["RATE_LIMIT_LOGIN_PER_ADDRESS"], key_func=limits.address_key,
    methods=["POST"], deduct_when=_failed_sign_in, scope="login-address",
    error_message="Too many failed sign-in attempts.",
)  # fmt: skip
def login() -> ResponseReturnValue:
    """Sign in with email and password (unless OIDC_ONLY: then only through the identity provider)."""
    form = LoginForm()
    if current_app.config["OIDC_ONLY"]:
        if request.method == "POST":
            return render_template("auth/login.html", form=form, problem=PASSWORDS_OFF), 403
    elif form.validate_on_submit():
        user = User.authenticate(form.email.data, form.password.data)
        if user is not None:
            sign_in(user)
            return redirect(safe_next(request.args.get("next")), code=303)
        form.password.errors.append("That email and password do not match.")
    provider_logout = session.pop("provider_logout_offer", None)
    return render_template(
        "auth/login.html", form=form, provider_logout=provider_logout
    ), 422 if form.errors else 200


PASSWORDS_OFF = "Passwords are turned off here: sign in through your team's identity provider."


@bp.route("/sign-in/<token>", methods=["GET", "POST"])
def sign_in_link(token: str) -> ResponseReturnValue:
    """A one-time sign-in link from `flask users link`: a button to press (so a link preview uses nothing),
    then the person is signed in and the link stops working."""
    if request.method == "GET":
        person = User.use_sign_in_link(token, peek=True)
        return render_template("auth/sign_in_link.html", person=person), 200 if person else 404
    person = User.use_sign_in_link(token)
    if person is None:
        return render_template("auth/sign_in_link.html", person=None), 404
    if current_user.is_authenticated:  # someone else signed in on this browser: that sign-in ends
        current_user.end_session()
    sign_in(person)
    return redirect(url_for("chats.index"), code=303)


@bp.errorhandler(RateLimitExceeded)
def _too_many_attempts(error: RateLimitExceeded):
    """The sign-in page again, saying why it refused (whether the password was right is not checked)."""
    form = LoginForm()
    form.password.errors = [limits.limit_message(error)]
    response = Response(render_template("auth/login.html", form=form), status=429)
    response.headers["Retry-After"] = str(limits.seconds_until_allowed())
    return response


@bp.post("/logout")
@login_required
def logout() -> ResponseReturnValue:
    """Sign out: this sign-in ends server-side, so no copy of its cookies opens a page again."""
    current_user.end_session()
    db.session.commit()
    logout_user()
    if provider_logout := session.pop("provider_logout", None):  # signed in through the identity provider
        session["provider_logout_offer"] = provider_logout
    flash("Signed out.")
    return redirect(url_for("auth.login"), code=303)


@bp.get("/account")
@login_required
def account() -> ResponseReturnValue:
    """One's account: the name others see, the password, and the API keys that act as oneself."""
    return _account_page()


@bp.route("/account/password", methods=["GET", "POST"])
@login_required
def password() -> ResponseReturnValue:
    """Change one's own password; every other sign-in of the user ends, and this one starts afresh. (The
    account page was here: a GET goes there.)"""
    if request.method == "GET":
        return redirect(url_for("auth.account"), code=301)
    form = PasswordForm()
    if form.validate_on_submit():
        user = current_user._get_current_object()
        user.set_password(form.new_password.data)
        user.end_all_sessions()
        sign_in(user)
        flash("Password changed. Every other sign-in with the old password has been signed out.")
        return redirect(url_for("chats.index"), code=303)
    return _account_page(password_form=form)


@bp.post("/account/name")
@login_required
def name() -> ResponseReturnValue:
    """Choose the name others see on one's messages (empty: the e-mail's local part)."""
    form = NameForm()
    if form.validate_on_submit():
        current_user.name = form.name.data or None
        db.session.commit()
        flash(f"Others now see your messages as {current_user.display_name}'s.")
        return redirect(url_for("auth.account"), code=303)
    return _account_page(name_form=form)


@bp.post("/account/keys")
@login_required
def create_key() -> ResponseReturnValue:
    """Make an API key that acts as oneself; its secret is shown on this one page and never again."""
    form = ApiKeyForm()
    if not form.validate_on_submit():
        return _account_page(key_form=form)
    key, secret = ApiKey.issue(current_user._get_current_object(), form.key_name.data)
    db.session.commit()
    response = _account_page(key_form=ApiKeyForm(formdata=None), new_key=key, secret=secret)
    response.headers["Cache-Control"] = "no-store"  # the secret is in this page only
    return response


@bp.route("/account/keys/<int:key_id>/revoke", methods=["GET", "POST"])
@login_required
def revoke_key(key_id: int) -> ResponseReturnValue:
    """Ask, then revoke one of one's own API keys: clients using it are refused from the next request on."""
    key = db.session.scalar(
        sa.select(ApiKey).where(
            ApiKey.id == key_id, ApiKey.user_id == current_user.id, ApiKey.revoked_at.is_(None)
        )
    )
    if key is None:
        abort(404)
    if request.method == "GET":
        return render_template("auth/revoke_key.html", key=key)
    key.revoke()
    db.session.commit()
    flash(f"Revoked the key “{key.name}”: clients using it are refused from now on.")
    return redirect(url_for("auth.account", _anchor="api-keys"), code=303)


def _account_page(
    *,
    password_form: PasswordForm | None = None,
    name_form: NameForm | None = None,
    key_form: ApiKeyForm | None = None,
    new_key: ApiKey | None = None,
    secret: str | None = None,
) -> Response:
    """The account page; a form given has been posted (with its errors, the page is a 422)."""
    forms = {
        "form": password_form or PasswordForm(formdata=None),
        "name_form": name_form or NameForm(formdata=None, data={"name": current_user.name}),
        "key_form": key_form or ApiKeyForm(formdata=None),
    }
    keys = db.session.scalars(
        sa.select(ApiKey)
        .where(ApiKey.user_id == current_user.id, ApiKey.revoked_at.is_(None))
        .order_by(ApiKey.created_at.desc(), ApiKey.id.desc())
    ).all()
    agents = db.session.scalars(
        sa.select(Agent).where(Agent.account_id == current_user.account_id).order_by(Agent.name)
    ).all()
    html = render_template(
        "auth/account.html",
        keys=keys,
        new_key=new_key,
        secret=secret,
        agents=agents,
        api_base=url_for("api.models", _external=True).removesuffix("/models"),  # at the request's own host
        mcp_base=url_for("mcp.relay", _external=True).rstrip("/"),
        **forms,
    )
    failed = any(f.errors for f in forms.values())
    return Response(html, status=422 if failed else 200)


def sign_in(user: User) -> None:
    """A new sign-in: a server-side session whose token the session and remember-me cookies carry."""
    user.start_session()
    db.session.commit()
    login_user(user, remember=True)
    session.pop("provider_logout", None)  # webapp.web.oidc sets it again after a sign-in through the provider


def safe_next(target: str | None) -> str:
    """Only redirect to a path on this site after sign-in."""
    # Browsers read "\\" as "/", so "/\\evil.example" would leave the site like "//evil.example".
    if target and target.startswith("/") and not target.startswith("//") and "\\" not in target:
        if not urlsplit(target).netloc and not urlsplit(target).scheme:
            return target
    return url_for("chats.index")


def admin_required(view: Callable[..., ResponseReturnValue]) -> Callable[..., ResponseReturnValue]:
    """Admins manage agents and memory; members get a 403."""

    @functools.wraps(view)
    @login_required
    def wrapped(*args, **kwargs):
        if not current_user.is_admin:
            abort(403)
        return view(*args, **kwargs)

    return wrapped


def owned_or_404(model: type[M], object_id: int) -> M:
    """The row of `model` with this id in the signed-in user's account; anything else is a 404. Not for chats:
    an account's chat may be someone else's private one (readable_chat_or_404)."""
    if model is Chat:
        raise TypeError("a chat is found with readable_chat_or_404, which applies the access rule")
    if not 0 < object_id <= DATABASE_ID_MAX:
        abort(404)
    row = db.session.scalar(
        sa.select(model).where(model.id == object_id, model.account_id == current_user.account_id)
    )
    if row is None:
        abort(404)
    return row


def readable_chat_or_404(chat_id: int) -> Chat:
    """The chat with this id if the signed-in person may read it (webapp.models.access: a shared chat of their
    account, or a private one they are a person of). Anything else is a 404, the same whether the chat does not
    exist, is another account's or is someone else's private chat: every route that takes a chat or message id
    starts here, so a chat one may not read is not found and nothing changes."""
    if not 0 < chat_id <= DATABASE_ID_MAX:
        abort(404)
    chat = db.session.scalar(sa.select(Chat).where(Chat.id == chat_id, access.readable_chats(current_user)))
    if chat is None:
        abort(404)
    return chat
