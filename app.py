import gc

from webapp import config
from webapp.factory import create_app

try:
    app = create_app()
except config.ConfigError as error:
    raise SystemExit(f"Cairn cannot start: {error}") from None

# What is loaded lives as long as the process (gunicorn's worker, a flask command): set aside from garbage
# collection, as worker.py does, so no full collection walks it at a random moment of some request.
gc.freeze()
