"""Fixed paths inside every node container (the same for Docker, Apptainer and SLURM).

None lies under /root: Apptainer runs a container as the calling user and keeps the image's
directories as they are, and in the vLLM images /root is mode 0700, owned by root, so nothing
under it is reachable for a user (issue 28, FIELD_NOTES §9). kit's mounts live under /kit (made
by the runtime as a bind point, world-traversable), its secret files under /run/kit, and what kit
writes while a node runs under /tmp/kit (Apptainer's /tmp is the host's, under SLURM a job-private
folder; Docker's a tmpfs with docker.read_only).
"""

HF_HOME = "/kit/hf-cache"
SECRETS_DIR = "/run/kit/secrets"
HF_TOKEN_PATH = f"{SECRETS_DIR}/hf_token"
API_KEY_PATH = f"{SECRETS_DIR}/api_key"
RAY_TOKEN_PATH = f"{SECRETS_DIR}/ray_token"
VLLM_CONFIG_ROOT = "/tmp/kit/vllm-config"
# Where compile_cache.dir is mounted; the caches vLLM and its compilers write go under it.
COMPILE_CACHE = "/kit/compile-cache"
# HOME of a container started as a user (docker.user) whose image has no home for it: vLLM, torch
# and Triton write their default caches under ~ (Apptainer binds the user's own home instead).
USER_HOME = "/tmp/kit/home"
