from kit.commands._stub import not_implemented

command = not_implemented("slurm", "Write (and optionally submit) an sbatch launcher from the same plan.")
