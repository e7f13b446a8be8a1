from kit.commands._stub import not_implemented

command = not_implemented("logs", "Show (or follow) a node container's logs.")
