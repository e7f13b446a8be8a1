from kit.commands._stub import not_implemented

command = not_implemented("serve", "Start `vllm serve` on the cluster and wait until it is healthy.")
