"""The `flask` commands: one module per area, each listing its commands in COMMANDS."""

from flask import Flask

from webapp.cli import (
    agents,
    api_keys,
    backup,
    connections,
    core,
    forgetting,
    mcp,
    memories,
    models,
    summaries,
    tools,
)


def register_cli(app: Flask) -> None:
    for module in (
        core,
        agents,
        connections,
        tools,
        memories,
        forgetting,
        summaries,
        mcp,
        api_keys,
        models,
        backup,
    ):
        for command in module.COMMANDS:
            app.cli.add_command(command)
