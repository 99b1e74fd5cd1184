"""The models the local llama.cpp server serves: the bundled SmolLM2, and the capable models a person downloads
from the model host into instance/models/ (catalog.py: the pinned catalog and what is installed; download.py:
resumable, checked downloads with their progress in a status file any process can read).

Nothing here needs the app or the database, so the model server's process, a worker's job, `flask models` and
the admin page all use the same functions."""
