from kit.commands._stub import not_implemented

command = not_implemented("down", "Remove every container and network of the cluster.")
