"""Image references: one grammar for every verb (kit pull, kit build, kit up, kit slurm...), a
subset of distribution/reference's: [REGISTRY[:PORT]/]PATH[:TAG][@ALGO:HEX]. The first component
is a registry only when it has a '.' or a ':' or is `localhost` (as the engine reads it), so
`MyOrg/x` is refused as the engine would; digests are sha256, sha384 or sha512 with their exact
lengths (go-digest's registered algorithms).
"""

from __future__ import annotations

import re
from collections.abc import Sequence
from dataclasses import dataclass

from kit.errors import ImageRefError
from kit.validate import preview

_COMPONENT = r"[a-z0-9]+(?:(?:[._]|__|-+)[a-z0-9]+)*"
_LABEL = r"[a-zA-Z0-9](?:[a-zA-Z0-9-]*[a-zA-Z0-9])?"
_REGISTRY = rf"(?:localhost(?::[0-9]+)?|{_LABEL}(?:\.{_LABEL})+(?::[0-9]+)?|{_LABEL}:[0-9]+)"
_REF_RE = re.compile(
    rf"(?P<repo>(?:{_REGISTRY}/)?{_COMPONENT}(?:/{_COMPONENT})*)"
    r"(?::(?P<tag>[\w][\w.-]{0,127}))?"
    r"(?:@(?P<digest>sha256:[a-f0-9]{64}|sha384:[a-f0-9]{96}|sha512:[a-f0-9]{128}))?"
)


@dataclass(frozen=True)
class ImageRef:
    """A parsed image reference. `tag` is 'latest' when neither tag nor digest was given."""

    repository: str
    tag: str | None
    digest: str | None

    @property
    def pull_tag(self) -> str:
        """What the engine's `tag` parameter takes: the digest wins (the engine accepts one there)."""
        return self.digest or self.tag or "latest"

    def __str__(self) -> str:
        text = self.repository
        if self.tag:
            text += f":{self.tag}"
        if self.digest:
            text += f"@{self.digest}"
        return text


def parse_ref(ref: str) -> ImageRef:
    """Split an image reference; raise ImageRefError (exit 5) for a malformed one."""
    text = ref.strip()
    match = _REF_RE.fullmatch(text)
    if not text or match is None:
        raise ImageRefError(
            f"malformed image reference {preview(ref)}",
            hint="use [REGISTRY[:PORT]/]NAME[:TAG][@sha256:DIGEST], lowercase name, e.g. vllm/vllm-openai:v0.32.0",
        )
    tag, digest = match.group("tag"), match.group("digest")
    return ImageRef(match.group("repo"), tag if tag or digest else "latest", digest)


def familiar_repository(repository: str) -> str:
    """Docker Hub names the way the engine shows them: docker.io/library/ubuntu -> ubuntu."""
    for prefix in ("docker.io/", "index.docker.io/", "registry-1.docker.io/"):
        if repository.startswith(prefix):
            repository = repository[len(prefix) :]
            break
    else:
        return repository
    return repository.removeprefix("library/")


def pick_digest(ref: ImageRef, repo_digests: Sequence[str], image_id: str | None) -> str | None:
    """The repo digest (REPO@sha256:...) that belongs to `ref`'s repository, else any, else the image id."""
    want = familiar_repository(ref.repository)
    for item in repo_digests:
        repo, _, _ = item.partition("@")
        if familiar_repository(repo) == want:
            return item
    return repo_digests[0] if repo_digests else image_id


def is_image_ref(ref: str) -> bool:
    """Whether `ref` is a well-formed image reference (parse_ref would accept it)."""
    return _REF_RE.fullmatch(ref.strip()) is not None and bool(ref.strip())
