"""Where a build's packages come from: an extra CA bundle, package index URLs, pinned source archives.

The CA bundle and the URLs reach the build as BuildKit secrets, read by build_steps.py inside each RUN:
never a layer, a label, the image spec or `docker history`, so an index URL may carry a token. A recipe
names a separate torch index (torch.index); its URL comes from the option or the environment, else
from verlbox's table of known indexes below (never from the recipe, never kept in the image).
"""

from __future__ import annotations

import os
import re
from collections.abc import Mapping
from dataclasses import dataclass, field, replace
from pathlib import Path
from typing import TYPE_CHECKING
from urllib.parse import urlsplit

from rich.console import Console

from verlbox.errors import UsageError
from verlbox.host.building.archives import AcceptedArchive, check_archive, fetch_archive, mirror_url
from verlbox.host.recipes.archive import ArchivePin
from verlbox.runtime.steps.urls import shown_under, split_userinfo

if TYPE_CHECKING:
    from verlbox.host.recipes.recipe import Base

_INDEX_URL = re.compile(r"(https?|file)://\S+")

# the wheel indexes a recipe's torch.index may name, at their upstream addresses; a mirror replaces
# them with --torch-index-url. All of these builds still carry sm_60/sm_61 code.
TORCH_INDEXES = {
    "pytorch-cu118": "https://download.pytorch.org/whl/cu118",
    "pytorch-cu121": "https://download.pytorch.org/whl/cu121",
    "pytorch-cu124": "https://download.pytorch.org/whl/cu124",
    "pytorch-cu126": "https://download.pytorch.org/whl/cu126",
}


def _index_url(value: str | None, option: str) -> str | None:
    if value is None or not value.strip():
        return None
    if not _INDEX_URL.fullmatch(value):
        raise UsageError(f"{option} {shown_url(value)!r}: expected an http(s):// or file:// URL without spaces")
    try:
        split_userinfo(value)
    except ValueError as error:  # its message shows no part of the URL
        raise UsageError(f"{option} {shown_url(value)!r}: {error}") from None
    return value


def _apt_mirror(value: str | None) -> str | None:
    """An index URL, without a query or fragment: apt appends its own paths (dists/...) to the mirror's."""
    mirror = _index_url(value, "--apt-mirror")
    if mirror and ("?" in mirror or "#" in mirror):
        raise UsageError(f"--apt-mirror {shown_url(mirror)!r}: apt appends its paths to the URL, so no '?' or '#'")
    return mirror


def shown_url(value: str) -> str:
    """VALUE as an error may show it: a malformed URL too loses what could be a credential, and its path is
    `***` (a token may ride there: `https://host/TOKEN/simple/`)."""
    hidden = "(the value, not shown: it may hold a credential)"
    try:
        shown = shown_under(value, [value])
    except ValueError:
        return hidden
    # no host part found (`https//u:secret@host`, `u:secret@host`): nothing was taken out of it
    return hidden if "@" in shown or not urlsplit(value).netloc else shown


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
    # a mirror that serves archives by name (URL/NAME); None: each archive's upstream
    archives_url: str | None = None

    @classmethod
    def from_options(
        cls,
        ca_bundle: str | None,
        pip_index_url: str | None,
        torch_index_url: str | None,
        environ: Mapping[str, str] = os.environ,
        apt_mirror: str | None = None,
        archives: str | None = None,
        archives_url: str | None = None,
    ) -> BuildSources:
        bundle = Path(ca_bundle) if ca_bundle else None
        if bundle is not None and not bundle.is_file():
            raise UsageError(f"--ca-bundle {ca_bundle}: no such file")
        return cls(
            bundle.resolve() if bundle else None,
            _index_url(pip_index_url or environ.get("VERLBOX_PIP_INDEX_URL"), "--pip-index-url"),
            _index_url(torch_index_url or environ.get("VERLBOX_TORCH_INDEX_URL"), "--torch-index-url"),
            _apt_mirror(apt_mirror or environ.get("VERLBOX_APT_MIRROR")),
            Path(archives) if archives else default_archive_dir(environ),
            _index_url(archives_url or environ.get("VERLBOX_SOURCES_URL"), "--sources-url"),
        )

    def with_torch_index(self, recipe_name: str, index: str | None) -> BuildSources:
        """These sources with the URL of the recipe's torch index filled in from the table when none was given."""
        if not index or self.torch_index_url:
            return self
        if index not in TORCH_INDEXES:
            raise UsageError(
                f"recipe {recipe_name} installs torch from the {index!r} wheel index, which verlbox does not know "
                f"(known: {', '.join(TORCH_INDEXES)}): give its URL with --torch-index-url or VERLBOX_TORCH_INDEX_URL"
            )
        return replace(self, torch_index_url=TORCH_INDEXES[index])

    def check_apt_mirror_fits(self, recipe_name: str, base: Base) -> None:
        """A Debian mirror given to a build of a base of another distribution is refused before any step:
        apt on that base would read its own archive's paths from the mirror and fail mid-build."""
        if self.apt_mirror and base.distribution != "debian":
            raise UsageError(
                f"recipe {recipe_name}: its base {base.image} is {base.distribution_name}, and --apt-mirror (or "
                f"VERLBOX_APT_MIRROR) is a Debian mirror, which {base.distribution_name}'s apt cannot read: "
                "build without it"
            )

    def archive(self, pin: ArchivePin, console: Console | None = None) -> AcceptedArchive:
        """A pinned source archive from the cache, fetched into it when missing; checked before any build starts."""
        path = self.archives / pin.name
        if path.is_file():
            return check_archive(path, pin)
        return fetch_archive(
            pin, self.archives, self.archive_url(pin), console or Console(stderr=True, highlight=False)
        )

    def archive_url(self, pin: ArchivePin) -> str:
        """Where a pinned archive is fetched from: the build's archive mirror, else its upstream."""
        return mirror_url(self.archives_url, pin.name) if self.archives_url else pin.upstream_url

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
