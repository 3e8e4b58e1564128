"""Image references (`[registry[:port]/]path[:tag][@sha256:...]`), parsed once, by Docker's grammar.

Checked before anything is built, so that `--tag myimage` or `--tag localhost:5000/img` is either
accepted whole or refused at once, never after a build has run.
"""

from __future__ import annotations

import re
from dataclasses import dataclass

from verlbox.errors import UsageError

_COMPONENT = r"[a-z0-9]+(?:(?:[._]|__|-+)[a-z0-9]+)*"
_DOMAIN = r"(?:[A-Za-z0-9](?:[A-Za-z0-9-]*[A-Za-z0-9])?)(?:\.(?:[A-Za-z0-9](?:[A-Za-z0-9-]*[A-Za-z0-9])?))*(?::[0-9]+)?"
_TAG = re.compile(r"[\w][\w.-]{0,127}")
_DIGEST = re.compile(r"sha256:[0-9a-f]{64}")
_PATH = re.compile(rf"{_COMPONENT}(?:/{_COMPONENT})*")


@dataclass(frozen=True)
class ImageReference:
    repository: str  # with the registry, if any
    tag: str | None
    digest: str | None

    def __str__(self) -> str:
        text = self.repository
        if self.tag:
            text += f":{self.tag}"
        if self.digest:
            text += f"@{self.digest}"
        return text


def parse_reference(text: str) -> ImageReference:
    """Docker's reference grammar; raises ValueError saying what is wrong."""
    if not text or len(text) > 255:
        raise ValueError(f"expected an image reference such as 'name:tag', got {text!r}")
    rest, _, digest = text.partition("@")
    if digest and not _DIGEST.fullmatch(digest):
        raise ValueError(f"{text!r}: the digest after '@' must be sha256: and 64 hex digits")
    name, tag = rest, None
    slash = rest.rfind("/")
    if (colon := rest.rfind(":")) > slash:
        name, tag = rest[:colon], rest[colon + 1 :]
        if not _TAG.fullmatch(tag):
            raise ValueError(f"{text!r}: the tag {tag!r} may hold only letters, digits, '_', '.' and '-'")
    first, _, remainder = name.partition("/")
    if remainder and ("." in first or ":" in first or first == "localhost"):
        if not re.fullmatch(_DOMAIN, first):
            raise ValueError(f"{text!r}: {first!r} is not a registry host[:port]")
        path = remainder
    else:
        path = name
    if not _PATH.fullmatch(path):
        raise ValueError(
            f"{text!r}: a repository name is lowercase letters, digits and separators (., _, __, -) between '/'"
        )
    return ImageReference(name, tag, digest or None)


def parse_tag(text: str) -> ImageReference:
    """A `--tag` value: a reference without a digest; no tag means Docker's `latest`, as `docker tag` does."""
    try:
        reference = parse_reference(text)
    except ValueError as exc:
        raise UsageError(f"--tag {exc}") from None
    if reference.digest:
        raise UsageError(f"--tag {text!r}: a tag cannot carry a digest")
    return ImageReference(reference.repository, reference.tag or "latest", None)


def full_name(reference: str) -> str:
    """A reference as Docker spells it in full (docker.io/library/debian:latest for debian)."""
    parsed = parse_reference(reference)
    name = parsed.repository if "/" in parsed.repository else f"library/{parsed.repository}"
    first = name.split("/", 1)[0]
    if not ("." in first or ":" in first or first == "localhost"):
        name = f"docker.io/{name}"
    return f"{name}:{parsed.tag or 'latest'}" + (f"@{parsed.digest}" if parsed.digest else "")
