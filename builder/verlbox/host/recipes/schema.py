"""Field types for recipes: each refuses what could not reach a Dockerfile or a shell safely.

Recipe text ends up in Dockerfile instructions, shell commands and image labels. The schema keeps
every value to a shape that has one meaning (versions, PEP 508 names, https URLs without
credentials, commits, digests, text without control characters), and `shell_quote` is the one
quoting rule the templates apply to every recipe value on top of that.
"""

from __future__ import annotations

import re
import shlex
from collections.abc import Mapping
from typing import Annotated, Any

from packaging.version import InvalidVersion, Version
from pydantic import AfterValidator, BaseModel, BeforeValidator, ConfigDict, Field, ValidationError

_CONTROL = re.compile(r"[\x00-\x1f\x7f]")


def _must_be_text(value: object) -> object:
    if isinstance(value, (int, float)) and not isinstance(value, bool):
        raise ValueError(f"expected a quoted string, got the number {value!r} (YAML reads 3.10 as 3.1)")
    return value


def no_control_characters(value: str) -> str:
    if found := _CONTROL.search(value):
        raise ValueError(f"control character {found.group()!r} is not allowed (a newline would add a Dockerfile line)")
    return value


def _exact_version(value: str) -> str:
    try:
        parsed = Version(value)
    except InvalidVersion:
        parsed = None
    if parsed is None or value != value.strip() or not re.fullmatch(r"[0-9A-Za-z.+!-]+", value):
        raise ValueError(
            f"expected an exact version such as '2.6.0', got {value!r} (ranges, wildcards and 'latest' are not pins)"
        )
    return value


def _debian_version(value: str) -> str:
    if not re.fullmatch(r"[0-9][A-Za-z0-9.+~:-]*", value):
        raise ValueError(f"expected an exact Debian package version such as '8.9.7.29-1+cuda11.8', got {value!r}")
    return value


_NAME = r"[A-Za-z0-9]([A-Za-z0-9._-]*[A-Za-z0-9])?"
_REQUIREMENT_NAME = re.compile(rf"{_NAME}(\[{_NAME}(,{_NAME})*\])?")


def _package_name(value: str) -> str:
    if not _REQUIREMENT_NAME.fullmatch(value):
        raise ValueError(
            f"expected a PEP 508 package name, optionally with extras (e.g. 'ray[default]'), got {value!r}"
        )
    return value


_HTTPS_URL = re.compile(r"https://[A-Za-z0-9.-]+(:[0-9]{1,5})?(/[A-Za-z0-9._~%+/-]*)?")


def _https_url(value: str) -> str:
    authority = value.split("/", 3)[2] if value.count("/") >= 2 else ""
    if "@" in authority:
        raise ValueError("credentials in a URL would be kept in the image: pass them at build time instead")
    if not _HTTPS_URL.fullmatch(value):
        raise ValueError(f"expected an https:// URL of letters, digits and ._~%+/- only, got {value!r}")
    return value


_DEBIAN_PACKAGE = re.compile(r"[a-z0-9][a-z0-9+.-]+")
# as pip records it: a file found on an index keeps its URL quoting (torch-2.6.0%2Bcu118-...whl)
_DISTRIBUTION_FILE = re.compile(r"[A-Za-z0-9][A-Za-z0-9._+%-]*\.(whl|tar\.gz|zip)")


def _distribution_name(value: str) -> str:
    if not re.fullmatch(_NAME, value):
        raise ValueError(f"expected a PEP 508 distribution name such as 'torch', got {value!r}")
    return value


def _debian_package(value: str) -> str:
    if not _DEBIAN_PACKAGE.fullmatch(value):
        raise ValueError(
            f"expected a Debian package name (lower-case letters, digits and + . -, starting with a letter or "
            f"digit), got {value!r}"
        )
    return value


def _debian_pin(value: str) -> str:
    name, equals, version = value.partition("=")
    if not equals:
        raise ValueError(f"expected NAME=VERSION of a Debian package, got {value!r}")
    _debian_package(name)
    _debian_version(version)
    return value


def _distribution_file(value: str) -> str:
    if not _DISTRIBUTION_FILE.fullmatch(value):
        raise ValueError(f"expected the file name of a wheel or source archive, got {value!r}")
    return value


def _image_reference(value: str) -> str:
    from verlbox.host.clients.reference import parse_reference

    parse_reference(value)
    return value


def fault_lines(exc: ValidationError) -> list[str]:
    """One `KEY: what it should hold` per fault (KEY dotted, as in steps.3.apt.0.version)."""
    return [f"{'.'.join(map(str, e['loc'])) or '(the file)'}: {describe_error(e)}" for e in exc.errors()]


def describe_error(error: Mapping[str, Any]) -> str:
    """A pydantic error as the rest of a one-line message: what the key should have held."""
    if error["type"] == "extra_forbidden":
        return "unknown key"
    if error["type"] == "missing":
        return "required key is missing"
    return str(error["msg"]).removeprefix("Value error, ")


Text = Annotated[str, BeforeValidator(_must_be_text), AfterValidator(no_control_characters)]
ExactVersion = Annotated[Text, AfterValidator(_exact_version)]
DebianVersion = Annotated[Text, AfterValidator(_debian_version)]
PackageName = Annotated[Text, AfterValidator(_package_name)]
HttpsUrl = Annotated[Text, AfterValidator(_https_url)]
GitCommit = Annotated[str, Field(pattern=r"^[0-9a-f]{40}$")]
Sha256 = Annotated[str, Field(pattern=r"^[0-9a-f]{64}$")]
Digest = Annotated[str, Field(pattern=r"^sha256:[0-9a-f]{64}$")]
Slug = Annotated[str, Field(pattern=r"^[a-z0-9][a-z0-9-]*$")]
DistributionName = Annotated[Text, AfterValidator(_distribution_name)]
DistributionFile = Annotated[Text, AfterValidator(_distribution_file)]
DebianPackage = Annotated[Text, AfterValidator(_debian_package)]
DebianPin = Annotated[Text, AfterValidator(_debian_pin)]
ImageReference = Annotated[Text, AfterValidator(_image_reference)]
ComputeCapability = Annotated[str, BeforeValidator(_must_be_text), Field(pattern=r"^[1-9][0-9]?\.[0-9]$")]


class Strict(BaseModel):
    model_config = ConfigDict(extra="forbid", frozen=True)


def shell_quote(value: object) -> str:
    """The one quoting rule for recipe values in a Dockerfile: a single shell word, no line breaks."""
    text = str(value)
    no_control_characters(text)
    return shlex.quote(text)
