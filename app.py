from webapp import config
from webapp.factory import create_app

try:
    app = create_app()
except config.ConfigError as error:
    raise SystemExit(f"Cairn cannot start: {error}") from None
