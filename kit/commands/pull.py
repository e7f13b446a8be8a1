from kit.commands._stub import not_implemented

command = not_implemented("pull", "Pull a vLLM image (Docker image or Apptainer SIF) and record its digest.")
