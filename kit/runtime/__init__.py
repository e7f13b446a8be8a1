"""Container runtime adapters. Only kit/runtime/docker.py imports docker; only
kit/runtime/apptainer.py imports spython. Both take the pure plan (kit.plan) unchanged."""
