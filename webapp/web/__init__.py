"""The pages people use: sign-in and accounts (auth), chats, agents, health; their guards and helpers."""
