"""Agents as files: export an agent (settings, memories, audit trail, sessions, optionally its chats) as a
versioned cairn-agent JSON document, and import one (or a Letta .af file) into an account as a new agent.

The format is docs/agent-file.md; its JSON Schema is webapp.agent_files.schema.SCHEMA, printed into
docs/cairn-agent.schema.json by `flask agents schema`."""
