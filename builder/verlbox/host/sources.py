"""Where a build's packages come from: an extra CA bundle and package index URLs, for one build only.

All of them reach the build as BuildKit secrets, read by build-env.sh inside each RUN: never a
layer, a label, the image spec or `docker history`, so an index URL may carry a token. A recipe
names a separate torch index (torch.index); its URL is always given here.
"""

from __future__ import annotations

import os
import re
from collections.abc import Mapping
from dataclasses import dataclass, field
from pathlib import Path

from verlbox.errors import UsageError
from verlbox.runtime.apex_build import file_sha256

_INDEX_URL = re.compile(r"(https?|file)://\S+")


def _index_url(value: str | None, option: str) -> str | None:
    if value is None or not value.strip():
        return None
    if not _INDEX_URL.fullmatch(value):
        raise UsageError(f"{option} {value!r}: expected an http(s):// or file:// URL without spaces")
    return value


def default_archive_dir(environ: Mapping[str, str]) -> Path:
    if environ.get("VERLBOX_SOURCES"):
        return Path(environ["VERLBOX_SOURCES"])
    return Path(environ.get("XDG_CACHE_HOME") or Path.home() / ".cache") / "verlbox" / "sources"


@dataclass(frozen=True)
class BuildSources:
    ca_bundle: Path | None = None
    pip_index_url: str | None = None
    torch_index_url: str | None = None
    apt_mirror: str | None = None
    # where source archives (Apex's) are looked up by name; each is checked against its pinned sha256
    archives: Path = field(default_factory=lambda: default_archive_dir(os.environ))

    @classmethod
    def from_options(
        cls,
        ca_bundle: str | None,
        pip_index_url: str | None,
        torch_index_url: str | None,
        environ: Mapping[str, str] = os.environ,
        apt_mirror: str | None = None,
        archives: str | None = None,
    ) -> BuildSources:
        bundle = Path(ca_bundle) if ca_bundle else None
        if bundle is not None and not bundle.is_file():
            raise UsageError(f"--ca-bundle {ca_bundle}: no such file")
        return cls(
            bundle.resolve() if bundle else None,
            _index_url(pip_index_url or environ.get("VERLBOX_PIP_INDEX_URL"), "--pip-index-url"),
            _index_url(torch_index_url or environ.get("VERLBOX_TORCH_INDEX_URL"), "--torch-index-url"),
            _index_url(apt_mirror or environ.get("VERLBOX_APT_MIRROR"), "--apt-mirror"),
            Path(archives) if archives else default_archive_dir(environ),
        )

    def require_torch_index(self, recipe_name: str, index: str | None) -> None:
        if index and not self.torch_index_url:
            raise UsageError(
                f"recipe {recipe_name} installs torch from the {index!r} wheel index: give its URL with "
                "--torch-index-url or VERLBOX_TORCH_INDEX_URL (used for this build only, never kept in the image)"
            )

    def archive(self, name: str, sha256: str) -> Path:
        """A pinned source archive, checked before any build starts."""
        path = self.archives / name
        if not path.is_file():
            raise UsageError(
                f"{path}: missing. The build needs this archive (sha256 {sha256}); put it in that folder or "
                "point --sources / VERLBOX_SOURCES at one that has it (a bundle carries it too)"
            )
        found = file_sha256(path)
        if found != sha256:
            raise UsageError(f"{path}: sha256 {found}, but the recipe pins {sha256}: refusing other source bytes")
        return path

    def secret_arguments(self) -> tuple[list[str], dict[str, str]]:
        """buildx --secret arguments and the environment variables they read from."""
        arguments: list[str] = []
        environment: dict[str, str] = {}
        if self.ca_bundle:
            arguments += ["--secret", f"id=ca_bundle,src={self.ca_bundle}"]
        urls = (
            ("pip_index_url", self.pip_index_url),
            ("torch_index_url", self.torch_index_url),
            ("apt_mirror", self.apt_mirror),
        )
        for secret, value in urls:
            if value:
                variable = f"VERLBOX_SECRET_{secret.upper()}"
                arguments += ["--secret", f"id={secret},env={variable}"]
                environment[variable] = value
        return arguments, environment
