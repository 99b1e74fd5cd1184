"""create_app: the Flask app, with its extensions, blueprints, CLI and template helpers."""

import os
from pathlib import Path

from dotenv import load_dotenv
from flask import Flask, redirect, url_for
from werkzeug.exceptions import NotFound
from werkzeug.routing import IntegerConverter

from webapp import admin, api, config, llm, models  # noqa: F401  (models registers the tables)
from webapp.cli import register_cli
from webapp.extensions import DATABASE_ID_MAX, csrf, db, login_manager, migrate
from webapp.jobs import queue
from webapp.mcp import proxy as mcp_proxy
from webapp.timeutil import utcnow
from webapp.web import agents, auth, chats, errors, guards, health, my_data, oidc, people, remembered
from webapp.web.markdown import render_markdown


def create_app(test_config: dict | None = None) -> Flask:
    """Build the app: defaults, then the environment, then test_config. Never touches the database."""
    load_dotenv()
    app = Flask("webapp", instance_path=os.environ.get("INSTANCE_PATH"), instance_relative_config=True)
    app.url_map.converters["int"] = DatabaseIdConverter
    app.config.from_mapping(config.load(app.instance_path))
    if test_config:
        app.config.from_mapping(test_config)
    app.config.setdefault("SQLALCHEMY_ENGINE_OPTIONS", config.engine_options(app.config))
    config.validate(app.config)

    db.init_app(app)
    migrate.init_app(app, db, directory=str(Path(app.root_path).parent / "migrations"), render_as_batch=True)
    login_manager.init_app(app)
    csrf.init_app(app)

    llm.init_app(app)
    queue.init_app(app)
    guards.init_app(app)
    errors.init_app(app)
    api.init_app(app)
    oidc.init_app(app)

    for blueprint in (
        auth.bp,
        oidc.bp,
        agents.bp,
        chats.bp,
        health.bp,
        admin.bp,
        people.bp,
        remembered.bp,
        my_data.bp,
        mcp_proxy.bp,
    ):
        app.register_blueprint(blueprint)
    app.add_url_rule("/", "home", lambda: redirect(url_for("chats.index")))
    app.jinja_env.filters["markdown"] = render_markdown
    app.jinja_env.globals["now_utc"] = utcnow
    app.register_error_handler(OverflowError, _out_of_range)
    register_cli(app)
    return app


class DatabaseIdConverter(IntegerConverter):
    """<int:...> in URLs: an id larger than a database column can hold is a plain 404, whatever the method.
    (The converter's own max would make werkzeug answer 405 when another method's rule has the same path.)"""

    def to_python(self, value: str) -> int:
        number = super().to_python(value)
        if number > DATABASE_ID_MAX:
            raise NotFound()
        return number


def _out_of_range(_error: OverflowError):
    return "A number or date in the request is out of range.", 400
