"""The pages people use: sign-in and accounts (auth), chats/, agents, people, health; their guards and helpers.

A door: it calls webapp.actions and the models, and imports no other door (tests/test_import_graph.py)."""
