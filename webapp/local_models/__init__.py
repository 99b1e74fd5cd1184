"""The models the local llama.cpp server serves: the bundled SmolLM2 and the capable ones downloaded beside it.

catalog.py pins the catalog (each file's commit and sha256 on the model host) and reads what is installed;
download.py fetches a model into instance/models/, resumable and checked, its progress in a status file any
process can read. Nothing here needs the app or the database, so the model server's process, a worker's job,
`flask models` and the admin page all use the same functions."""
