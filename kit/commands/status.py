from kit.commands._stub import not_implemented

command = not_implemented("status", "Show the cluster's containers and the Ray view of its nodes.")
