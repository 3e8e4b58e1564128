"""Where a build's packages come from: an extra CA bundle and package index URLs, for one build only.

All of them reach the build as BuildKit secrets, read by build-env.sh inside each RUN: never a
layer, a label, the image spec or `docker history`, so an index URL may carry a token. A recipe
names a separate torch index (torch.index); its URL is always given here.
"""

from __future__ import annotations

import os
import re
from collections.abc import Mapping
from dataclasses import dataclass
from pathlib import Path

from verlbox.errors import UsageError

_INDEX_URL = re.compile(r"(https?|file)://\S+")


def _index_url(value: str | None, option: str) -> str | None:
    if value is None or not value.strip():
        return None
    if not _INDEX_URL.fullmatch(value):
        raise UsageError(f"{option} {value!r}: expected an http(s):// or file:// URL without spaces")
    return value


@dataclass(frozen=True)
class BuildSources:
    ca_bundle: Path | None = None
    pip_index_url: str | None = None
    torch_index_url: str | None = None

    @classmethod
    def from_options(
        cls,
        ca_bundle: str | None,
        pip_index_url: str | None,
        torch_index_url: str | None,
        environ: Mapping[str, str] = os.environ,
    ) -> BuildSources:
        bundle = Path(ca_bundle) if ca_bundle else None
        if bundle is not None and not bundle.is_file():
            raise UsageError(f"--ca-bundle {ca_bundle}: no such file")
        return cls(
            bundle.resolve() if bundle else None,
            _index_url(pip_index_url or environ.get("VERLBOX_PIP_INDEX_URL"), "--pip-index-url"),
            _index_url(torch_index_url or environ.get("VERLBOX_TORCH_INDEX_URL"), "--torch-index-url"),
        )

    def require_torch_index(self, recipe_name: str, index: str | None) -> None:
        if index and not self.torch_index_url:
            raise UsageError(
                f"recipe {recipe_name} installs torch from the {index!r} wheel index: give its URL with "
                "--torch-index-url or VERLBOX_TORCH_INDEX_URL (used for this build only, never kept in the image)"
            )

    def secret_arguments(self) -> tuple[list[str], dict[str, str]]:
        """buildx --secret arguments and the environment variables they read from."""
        arguments: list[str] = []
        environment: dict[str, str] = {}
        if self.ca_bundle:
            arguments += ["--secret", f"id=ca_bundle,src={self.ca_bundle}"]
        for secret, value in (("pip_index_url", self.pip_index_url), ("torch_index_url", self.torch_index_url)):
            if value:
                variable = f"VERLBOX_SECRET_{secret.upper()}"
                arguments += ["--secret", f"id={secret},env={variable}"]
                environment[variable] = value
        return arguments, environment
