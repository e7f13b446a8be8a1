from kit.commands._stub import not_implemented

command = not_implemented("verify", "Prove the cluster is right: GPUs, versions, NCCL transport, bandwidth.")
