"""Sign-in and the access rules every view uses: signed in, within the user's account, admin where needed."""

import functools
from urllib.parse import urlsplit

import sqlalchemy as sa
from flask import Blueprint, abort, flash, redirect, render_template, request, url_for
from flask_login import current_user, login_required, login_user, logout_user
from flask_wtf import FlaskForm
from wtforms import EmailField, PasswordField
from wtforms.validators import DataRequired, Length

from webapp.extensions import db, login_manager
from webapp.models import User

bp = Blueprint("auth", __name__)

login_manager.login_view = "auth.login"
login_manager.login_message = "Please sign in to continue."


@login_manager.user_loader
def _load_user(user_id: str) -> User | None:
    return db.session.get(User, int(user_id))


class LoginForm(FlaskForm):
    email = EmailField("Email", validators=[DataRequired(), Length(max=254)])
    password = PasswordField("Password", validators=[DataRequired(), Length(max=200)])


@bp.route("/login", methods=["GET", "POST"])
def login():
    """Sign in with email and password."""
    form = LoginForm()
    if form.validate_on_submit():
        user = db.session.scalar(sa.select(User).where(User.email == form.email.data.strip().lower()))
        if user is not None and user.check_password(form.password.data):
            login_user(user, remember=True)
            return redirect(_safe_next(request.args.get("next")), code=303)
        form.password.errors.append("That email and password do not match.")
    return render_template("auth/login.html", form=form), 422 if form.errors else 200


@bp.post("/logout")
@login_required
def logout():
    """Sign out."""
    logout_user()
    flash("Signed out.")
    return redirect(url_for("auth.login"), code=303)


def _safe_next(target: str | None) -> str:
    """Only redirect to a path on this site after sign-in."""
    # Browsers read "\\" as "/", so "/\\evil.example" would leave the site like "//evil.example".
    if target and target.startswith("/") and not target.startswith("//") and "\\" not in target:
        if not urlsplit(target).netloc and not urlsplit(target).scheme:
            return target
    return url_for("chats.index")


def admin_required(view):
    """Admins manage agents and memory; members get a 403."""

    @functools.wraps(view)
    @login_required
    def wrapped(*args, **kwargs):
        if not current_user.is_admin:
            abort(403)
        return view(*args, **kwargs)

    return wrapped


def owned_or_404(model, object_id: int):
    """The row of `model` with this id in the signed-in user's account; anything else is a 404."""
    row = db.session.scalar(
        sa.select(model).where(model.id == object_id, model.account_id == current_user.account_id)
    )
    if row is None:
        abort(404)
    return row
