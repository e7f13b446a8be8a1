from kit.commands._stub import not_implemented

command = not_implemented("demo", "Run the local demo: a 2-node CPU cluster serving a tiny model.")
