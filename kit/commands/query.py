from kit.commands._stub import not_implemented

command = not_implemented("query", "Send OpenAI-style requests to the server: models and a chat.")
