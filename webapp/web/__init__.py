"""The pages people use: sign-in and accounts (auth), chats (a package, one module per concern), agents, people,
health; their guards and helpers. A door: it calls webapp.actions and the models, and no other door."""
