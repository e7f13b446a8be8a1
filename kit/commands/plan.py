from kit.commands._stub import not_implemented

command = not_implemented("plan", "Size a model: GPUs, nodes, TP/PP and KV-cache room.")
