"""Hub I/O, the only part of kit.sizing that touches the filesystem or the network: find a model's
directory (a path or an HF-cache snapshot), read its config.json and checkpoint index, and fetch
config.json from the Hugging Face Hub when asked (`kit plan --fetch`).
"""

from __future__ import annotations

import json
import os
from pathlib import Path
from typing import Any

from kit.errors import ConfigError


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


def find_model_dir(model: str, hf_cache: str | None = None) -> Path | None:
    """A local directory with config.json, or the newest HF-cache snapshot of `org/name`."""
    path = Path(model).expanduser()
    if (path / "config.json").is_file():
        return path
    if "/" not in model or path.exists():
        return None
    repo_dir = "models--" + model.strip("/").replace("/", "--")
    for cache in _hf_cache_dirs(hf_cache):
        root = cache / repo_dir
        snapshots = root / "snapshots"
        if not snapshots.is_dir():
            continue
        ref = root / "refs" / "main"
        if ref.is_file():
            pinned = snapshots / ref.read_text().strip()
            if (pinned / "config.json").is_file():
                return pinned
        candidates = [d for d in snapshots.iterdir() if (d / "config.json").is_file()]
        if candidates:
            return max(candidates, key=lambda d: (d / "config.json").stat().st_mtime)
    return None


def _read_json(path: Path) -> dict[str, Any]:
    try:
        data = json.loads(path.read_text())
    except (OSError, ValueError) as err:
        raise ConfigError(f"cannot read JSON: {err}", source=str(path), hint="check the file is complete JSON") from err
    if not isinstance(data, dict):
        raise ConfigError("is not a JSON object", source=str(path), hint="use the model's config")
    return data


def load_model_config(model: str, hf_cache: str | None = None, *, fetch: bool = False) -> dict[str, Any]:
    """config.json of a local directory or HF-cache entry (`org/name`).

    A ModelOpt `hf_quant_config.json` or an old-style GPTQ `quantize_config.json` beside it is
    folded in as `quantization_config`. With `fetch=True` (and only then) a missing config is
    downloaded from the Hugging Face Hub.
    """
    directory = find_model_dir(model, hf_cache)
    if directory is None:
        if fetch and "/" in model and not Path(model).expanduser().exists():
            return _fetch_config(model)
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
            if (directory / extra).is_file():
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
    if index.is_file():
        size = _read_json(index).get("metadata", {}).get("total_size")
        return int(size) if isinstance(size, (int, float)) else None
    single = directory / "model.safetensors"
    return single.stat().st_size if single.is_file() else None


def _fetch_config(model: str) -> dict[str, Any]:
    import requests  # only when the user asked to go online

    headers = {}
    token = os.environ.get("HF_TOKEN") or os.environ.get("HUGGING_FACE_HUB_TOKEN")
    if token:
        headers["Authorization"] = f"Bearer {token}"
    endpoint = os.environ.get("HF_ENDPOINT", "https://huggingface.co").rstrip("/")
    config: dict[str, Any] | None = None
    for name in ("config.json", "hf_quant_config.json"):
        url = f"{endpoint}/{model}/resolve/main/{name}"
        try:
            resp = requests.get(url, headers=headers, timeout=30)
        except requests.RequestException as err:
            raise ConfigError(
                f"cannot fetch {url}: {err}", key="model", hint="check the network or HF_ENDPOINT"
            ) from err
        if name == "config.json":
            if resp.status_code != 200:
                raise ConfigError(
                    f"{url} answered {resp.status_code}",
                    key="model",
                    hint="check the model name; gated models need HF_TOKEN",
                )
            config = resp.json()
        elif resp.status_code == 200 and config is not None:
            config.setdefault("quantization_config", resp.json())
    assert config is not None
    return config
