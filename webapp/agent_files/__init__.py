"""Agents as files: export an agent as a versioned JSON document, and import one (or a Letta .af file).

An export holds the agent's settings, memories, audit trail and sessions, optionally its chats; an import makes
a new agent of the account from it.

    export.py        an agent as a document: its settings, memories, audit trail and sessions; the export audited
    export_chats.py  with chats: the chats it carries or refers to, their messages and replies' provenance
    naming.py        how a file names rows (references), times and people
    validation.py    a file read and checked before anything is imported (read); a free name for the new agent
    restore.py       a checked file restored as a new agent of the account, in one transaction (import_agent)
    letta.py         a Letta .af file read as the agent it describes
    schema.py        the format's JSON Schema and caps

The format is docs/agent-file.md; its JSON Schema is webapp.agent_files.schema.SCHEMA, printed into
docs/cairn-agent.schema.json by `flask agents schema`."""
