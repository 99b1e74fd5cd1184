"""The processes of `make run`: how each is started (processes) and the supervisor that restarts them."""
