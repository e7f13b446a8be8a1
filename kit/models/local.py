"""A model's files as sizing reads them: find its directory (a path or an HF-cache snapshot), read
its config.json and checkpoint index, and fetch config.json from the Hugging Face Hub when asked
(`kit plan --fetch`).

One of each with `kit fetch` (issue 26): the snapshot is the one kit.models.fetch.find_snapshot
picks (refs/main, else kit's manifest), so the layout and the offline decision read the same
files; a Hub id is checked by kit.models.fetch.check_repo_id; the endpoint is
kit.models.hub.endpoint_from_env; the token is read by `read_token` here, for both verbs.

Every file is read through kit.safeload (regular files only, a size cap, UTF-8, a nesting limit):
a FIFO or /dev/zero given as a model, a 100,000-deep config.json or one that is not UTF-8 is one
line naming the file (issue 16). The Hub token comes from the file `hf_token_file` names, never
from HF_TOKEN or any other environment variable (kit keeps secrets in files).
"""

from __future__ import annotations

import math
import os
from collections.abc import Callable
from pathlib import Path
from typing import Any

from kit import safeload
from kit.errors import ConfigError
from kit.models.fetch import REPO_ID_RE, check_repo_id, find_snapshot, repo_folder
from kit.models.hub import endpoint_from_env

MAX_JSON_BYTES = 64 * 1024 * 1024  # model.safetensors.index.json of a 1T model is ~10 MB


def hf_cache_dirs(hf_cache: str | None) -> list[Path]:
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
    """A local directory with config.json, or the HF-cache snapshot of a Hub id that
    kit.models.fetch.find_snapshot picks for revision main (the one `kit fetch --check` and the
    offline decision read), else the cache's only snapshot."""
    path = Path(model).expanduser()
    if _holds((path / "config.json").is_file):
        return path
    if not REPO_ID_RE.fullmatch(model) or "--" in model or ".." in model or _holds(path.exists):
        return None
    for cache in hf_cache_dirs(hf_cache):
        try:
            snap = find_snapshot(cache, model) or _only_snapshot(cache / repo_folder(model) / "snapshots")
        except OSError:
            continue  # an unreadable cache entry is not this model's
        if snap is not None and _holds((snap / "config.json").is_file):
            return snap
    return None


def _only_snapshot(snapshots: Path) -> Path | None:
    """The one snapshot of a cache whose refs name none (copied by hand, or a download cut short):
    sizing may read it, though vLLM offline would not find it (the offline decision says so).
    With several and nothing to say which, none: kit never guesses by age."""
    if not _holds(snapshots.is_dir):
        return None
    found = [d for d in snapshots.iterdir() if _holds(d.is_dir)]
    return found[0] if len(found) == 1 else None


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
        if fetch and not _holds(path.exists):
            return _fetch_config(model, read_token(token_file) if token_file else None)
        where = ", ".join(str(d) for d in hf_cache_dirs(hf_cache))
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


def read_token(token_file: str, source: str | None = None) -> str:
    """The Hugging Face token in `token_file` (hf_token_file): one word, never echoed back
    (kit.safeload.read_secret: redacted from all output from then on). `source` says where the
    setting came from (kit.yaml, KIT_HF_TOKEN_FILE) for the error line."""
    return safeload.read_secret(token_file, key="hf_token_file", source=source or token_file)


def _fetch_config(model: str, token: str | None) -> dict[str, Any]:
    """config.json (and a ModelOpt hf_quant_config.json) of `org/name` from the Hub, read bounded."""
    check_repo_id(model, source="model")
    from kit.net import http  # only when the user asked to go online
    from kit.safe import text as safetext

    headers = {"Authorization": f"Bearer {token}"} if token else {}
    endpoint = endpoint_from_env()
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
