"""Why a file is refused."""


class AgentFileError(ValueError):
    """The file is refused, and nothing was changed: the message says why."""


class NameRefused(AgentFileError):
    """The file's name cannot be this agent's here (taken, or not a name the agent form takes); import it under
    another."""


class NameTaken(NameRefused):
    """An agent of the account has the file's name already; import it under another."""
