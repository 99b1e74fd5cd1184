"""Cairn: a multi-agent chat in which every agent keeps its own long-term memory (the app: webapp.factory)."""
