from kit.commands._stub import not_implemented

command = not_implemented("diagnose", "Classify known failure lines and NCCL transports in log files.")
