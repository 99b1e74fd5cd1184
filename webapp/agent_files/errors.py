"""Why a file is refused."""


class AgentFileError(ValueError):
    """The file is refused, and nothing was changed: the message says why."""


class NameTaken(AgentFileError):
    """An agent of the account has the file's name already; import it under another."""
