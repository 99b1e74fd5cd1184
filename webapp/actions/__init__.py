"""What a person can do in Cairn, written once, for every door to call.

Ask agents in a chat, search an agent's memory and save to it, see what its prompt would hold. Each verb holds its
rules (who may, what is heard, what is recorded); the doors (the pages in web/, /v1 in api/, MCP in mcp/, the
`flask` commands in cli/) translate their input and output and call it, so an agent answers the same whoever asks.
A door imports this package, never another door.

    ask.py      post a person's message and ask agents to reply (pages and /v1)
    memory.py   one agent's memory as one person may hear it: search, save, the prompt's memory (MCP)
    tool_servers.py  an admin's MCP servers: add (kept once it lists its tools), check, change, remove (Tools page, CLI)

Exporting and importing an agent are the verbs of agent_files/ (export_agent and record_export, import_agent),
called alike by the agents page and `flask agents`.
"""
