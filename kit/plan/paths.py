"""Fixed paths inside every node container (the same for Docker, Apptainer and SLURM)."""

HF_HOME = "/root/.cache/huggingface"
SECRETS_DIR = "/run/kit/secrets"
HF_TOKEN_PATH = f"{SECRETS_DIR}/hf_token"
API_KEY_PATH = f"{SECRETS_DIR}/api_key"
RAY_TOKEN_PATH = f"{SECRETS_DIR}/ray_token"
VLLM_CONFIG_ROOT = "/tmp/kit/vllm-config"
# Where compile_cache.dir is mounted; the caches vLLM and its compilers write go under it.
COMPILE_CACHE = "/root/.cache/kit-compile"
