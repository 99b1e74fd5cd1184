"""Agents as files: export an agent as a versioned JSON document, and import one (or a Letta .af file).

An export holds the agent's settings, memories, audit trail and sessions, optionally its chats; an import makes
a new agent of the account from it.

The format is docs/agent-file.md; its JSON Schema is webapp.agent_files.schema.SCHEMA, printed into
docs/cairn-agent.schema.json by `flask agents schema`."""
