"""Hub I/O, the only part of kit.sizing that touches the filesystem or the network: find a model's
directory (a path or an HF-cache snapshot), read its config.json and checkpoint index, and fetch
config.json from the Hugging Face Hub when asked (`kit plan --fetch`).

Every file is read through kit.safeload (regular files only, a size cap, UTF-8, a nesting limit):
a FIFO or /dev/zero given as a model, a 100,000-deep config.json or one that is not UTF-8 is one
line naming the file (issue 16). The Hub token comes from the file `hf_token_file` names, never
from HF_TOKEN or any other environment variable (kit keeps secrets in files).
"""

from __future__ import annotations

import math
import os
import re
from collections.abc import Callable
from pathlib import Path
from typing import Any

from kit import safeload
from kit.errors import ConfigError

MAX_JSON_BYTES = 64 * 1024 * 1024  # model.safetensors.index.json of a 1T model is ~10 MB
MAX_TOKEN_BYTES = 4096  # an HF token is ~40 characters
_REPO_ID = re.compile(r"[A-Za-z0-9][A-Za-z0-9._-]*/[A-Za-z0-9][A-Za-z0-9._-]*")
_COMMIT = re.compile(r"[0-9a-fA-F]{7,64}")


def _hf_cache_dirs(hf_cache: str | None) -> list[Path]:
    if hf_cache:
        return [Path(hf_cache).expanduser()]
    dirs = []
    for var in ("HF_HUB_CACHE", "HUGGINGFACE_HUB_CACHE"):
        if os.environ.get(var):
            dirs.append(Path(os.environ[var]).expanduser())
    home = os.environ.get("HF_HOME")
    dirs.append(Path(home).expanduser() / "hub" if home else Path.home() / ".cache/huggingface/hub")
    return dirs


def _holds(check: Callable[[], bool]) -> bool:
    """A Path test (is_file, exists, is_dir) that says False where the OS refuses the name (too
    long, a component that is not a directory) instead of raising OSError."""
    try:
        return check()
    except OSError:
        return False


def find_model_dir(model: str, hf_cache: str | None = None) -> Path | None:
    """A local directory with config.json, or the newest HF-cache snapshot of `org/name`."""
    path = Path(model).expanduser()
    if _holds((path / "config.json").is_file):
        return path
    if "/" not in model or _holds(path.exists):
        return None
    repo_dir = "models--" + model.strip("/").replace("/", "--")
    for cache in _hf_cache_dirs(hf_cache):
        root = cache / repo_dir
        snapshots = root / "snapshots"
        try:
            if not snapshots.is_dir():
                continue
            ref = _pinned_commit(root / "refs" / "main")
            if ref is not None and _holds((snapshots / ref / "config.json").is_file):
                return snapshots / ref
            candidates = [d for d in snapshots.iterdir() if _holds((d / "config.json").is_file)]
            if candidates:
                return max(candidates, key=lambda d: (d / "config.json").stat().st_mtime)
        except OSError:
            continue  # an unreadable cache entry is not this model's
    return None


def _pinned_commit(ref: Path) -> str | None:
    """The commit refs/main names, if it is a readable regular file holding a commit hash."""
    if not _holds(ref.is_file):
        return None
    try:
        text = safeload.read_text(ref, max_bytes=256, what="refs/main").strip()
    except ConfigError:
        return None
    return text if _COMMIT.fullmatch(text) else None


def _read_json(path: Path) -> dict[str, Any]:
    try:
        data = safeload.loads_json(safeload.read_text(path, max_bytes=MAX_JSON_BYTES), source=str(path))
    except ConfigError as err:
        # One line naming the file: not a regular file, too large, not UTF-8, too deep, not JSON.
        prefix = f"{err.source}: " if err.source else ""
        reason = err.message[len(prefix) :] if prefix and err.message.startswith(prefix) else err.message
        raise ConfigError(f"cannot read JSON: {reason}", source=err.source or str(path), hint=err.hint) from None
    if not isinstance(data, dict):
        raise ConfigError("is not a JSON object", source=str(path), hint="use the model's config")
    return data


def load_model_config(
    model: str, hf_cache: str | None = None, *, fetch: bool = False, token_file: str | None = None
) -> dict[str, Any]:
    """config.json of a local directory or HF-cache entry (`org/name`).

    A ModelOpt `hf_quant_config.json` or an old-style GPTQ `quantize_config.json` beside it is
    folded in as `quantization_config`. With `fetch=True` (and only then) a missing config is
    downloaded from the Hugging Face Hub, with the token in `token_file` when one is given.
    """
    directory = find_model_dir(model, hf_cache)
    path = Path(model).expanduser()
    if directory is None and _holds((path / "config.json").exists):
        _read_json(path / "config.json")  # there but not a regular file: say so
    if directory is None and _holds(path.exists) and not _holds(path.is_dir):
        raise ConfigError(
            "is not a directory",
            key="model",
            source=model,
            hint="pass the model's directory (the one holding config.json) or its Hub id org/name",
        )
    if directory is None:
        if fetch and "/" in model and not _holds(path.exists):
            return _fetch_config(model, read_token(token_file) if token_file else None)
        where = ", ".join(str(d) for d in _hf_cache_dirs(hf_cache))
        raise ConfigError(
            f"no config.json for {model!r} (looked in the directory and in {where})",
            key="model",
            hint=(
                "pass a model directory, --hf-cache DIR, download it first "
                f"(huggingface-cli download {model} config.json), or add --fetch"
            ),
        )
    config = _read_json(directory / "config.json")
    if "quantization_config" not in config:
        for extra in ("hf_quant_config.json", "quantize_config.json", "quant_config.json"):
            if _holds((directory / extra).is_file):
                quant = _read_json(directory / extra)
                if "quant_method" not in quant and "quantization" not in quant:
                    quant = {**quant, "quant_method": "gptq"}
                config = {**config, "quantization_config": quant}
                break
    return config


def load_checkpoint_size(model: str, hf_cache: str | None = None) -> int | None:
    """`metadata.total_size` of model.safetensors.index.json, when the model has one locally."""
    directory = find_model_dir(model, hf_cache)
    if directory is None:
        return None
    index = directory / "model.safetensors.index.json"
    if _holds(index.exists):
        metadata = _read_json(index).get("metadata")
        size = metadata.get("total_size") if isinstance(metadata, dict) else None
        if isinstance(size, float) and math.isfinite(size):
            size = int(size)
        ok = isinstance(size, int) and not isinstance(size, bool) and 0 < size < 1 << 60
        return size if ok else None
    single = directory / "model.safetensors"
    return single.stat().st_size if _holds(single.is_file) else None


def read_token(token_file: str) -> str:
    """The Hugging Face token in `token_file` (hf_token_file): one word, never echoed back
    (kit.safeload.read_secret: redacted from all output from then on)."""
    return safeload.read_secret(token_file, key="hf_token_file", source=token_file)


def _fetch_config(model: str, token: str | None) -> dict[str, Any]:
    """config.json (and a ModelOpt hf_quant_config.json) of `org/name` from the Hub, read bounded."""
    if not _REPO_ID.fullmatch(model) or ".." in model:
        raise ConfigError(
            f"{model!r} is not a Hub model id", key="model", hint="use org/name, e.g. meta-llama/Llama-3.1-8B"
        )
    from kit.net import http  # only when the user asked to go online
    from kit.safe import text as safetext

    headers = {"Authorization": f"Bearer {token}"} if token else {}
    endpoint = os.environ.get("HF_ENDPOINT", "https://huggingface.co").rstrip("/")
    safetext.register_url(endpoint)
    limits = http.DEFAULT.but(total_s=30.0, body_bytes=MAX_JSON_BYTES)
    config: dict[str, Any] | None = None
    for name in ("config.json", "hf_quant_config.json"):
        url = f"{endpoint}/{model}/resolve/main/{name}"
        shown = safetext.redact_url(url)
        try:
            # The Hub redirects to its CDN (another host: no Authorization sent there).
            resp = http.request("GET", url, headers=headers, limits=limits, redirects=5)
        except http.HttpError as err:
            raise ConfigError(err.message, key="model", hint="check the network or HF_ENDPOINT") from None
        status = resp.status
        if name == "config.json" and status != 200:
            raise _refused(model, shown, status, token is not None)
        if status != 200:
            continue
        try:
            data = http.decode_json(resp.body, url)
        except http.HttpError as err:
            raise ConfigError(err.message, key="model", hint="check the model") from None
        if not isinstance(data, dict):
            raise ConfigError("is not a JSON object", source=shown, hint="check the model")
        if config is None:
            config = data
        else:
            config.setdefault("quantization_config", data)
    assert config is not None
    return config


def _refused(model: str, url: str, status: int, with_token: bool) -> ConfigError:
    if status in (401, 403) and not with_token:
        return ConfigError(
            f"{model} is gated or private: the Hub answered {status} to a request without a token",
            key="hf_token_file",
            hint="put your Hugging Face token in a file (mode 600) and set hf_token_file in kit.yaml "
            "(or KIT_HF_TOKEN_FILE=PATH); kit never reads HF_TOKEN from the environment",
        )
    if status in (401, 403):
        return ConfigError(
            f"the Hub refused the token in hf_token_file for {model} ({status})",
            key="hf_token_file",
            hint=f"check the token and that your account has access to {model} (accept its licence on the Hub)",
        )
    if status == 404:
        return ConfigError(f"{url} answered 404", key="model", hint="check the model name (org/name)")
    return ConfigError(f"{url} answered {status}", key="model", hint="try again later, or check HF_ENDPOINT")
