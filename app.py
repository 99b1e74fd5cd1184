from webapp import config
from webapp.factory import create_app
from webapp.runtime import set_loaded_aside

try:
    app = create_app()
except config.ConfigError as error:
    raise SystemExit(f"Cairn cannot start: {error}") from None
set_loaded_aside()  # gunicorn's worker, a flask command: what is loaded lives as long as the process
