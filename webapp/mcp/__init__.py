"""The MCP server for agents' memory: search, save and the prompt's memory, as one person, over stdio or HTTP.

What a person may do with one agent's memory is webapp.actions.memory; this door translates it to MCP.
server.py   the MCP server (the official SDK's MCPServer): its tools and resources, and `flask mcp serve`'s stdio
http.py     the streamable HTTP app at /mcp/<agent-slug>: API keys, a rate limit per key; run by `flask mcp http`
proxy.py    /mcp on the web process, relayed to the MCP process (`make run` serves everything on one port)
"""
