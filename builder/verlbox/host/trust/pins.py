"""`verlbox build RECIPE --check`: is every pin of a recipe still served? Each upstream is asked, nothing is
built: the base's manifest (registry API v2), each Python pin on its simple index (a file for the recipe's
Python on linux x86_64), a wheel or archive named by URL (HEAD, or a one-byte GET where HEAD is refused;
Apex's from the cache when it is there), the cuDNN apt pin in NVIDIA's repository index (read only as the
repository's InRelease lists it, signed by the key the base's cuda-keyring holds), and the final
stage's whole pin set resolved once (uv, for the recipe's Python and platform), so that pins that cannot
coexist are named before any build. Nothing an index serves runs here: uv builds no sdist (one served only
as an sdist is named, and resolved without its own dependencies) and fetches no Python.
Mirrors and the CA bundle apply as in a build.
"""

from __future__ import annotations

import gzip
import hashlib
import os
import re
import shutil
import subprocess
import tempfile
import zipfile
import zlib
from collections.abc import Callable
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass
from html.parser import HTMLParser
from pathlib import Path
from urllib.parse import unquote, urlsplit

from packaging import tags
from packaging.specifiers import InvalidSpecifier, SpecifierSet
from packaging.utils import (
    InvalidSdistFilename,
    InvalidWheelFilename,
    canonicalize_name,
    parse_sdist_filename,
    parse_wheel_filename,
)
from packaging.version import InvalidVersion, Version

from verlbox.errors import UsageError
from verlbox.host.building.archives import check_archive
from verlbox.host.building.sources import BuildSources
from verlbox.host.clients.upstream import (
    Http,
    UpstreamError,
    host_of,
    registry_manifest,
    registry_manifest_url,
    status_line,
)
from verlbox.host.recipes.archive import ArchivePin
from verlbox.host.recipes.recipe import RecipeHead
from verlbox.runtime.steps.build_steps import secret_parts
from verlbox.runtime.steps.urls import page_url

# NVIDIA's CUDA apt repositories, where a CUDA base's cuDNN packages come from (a mirror: --nvidia-repo-url)
NVIDIA_CUDA_REPOS = "https://developer.download.nvidia.com/compute/cuda/repos"
# the oldest glibc of any base a recipe names (Ubuntu 22.04's 2.35; bookworm has 2.36): a wheel that needs a
# newer one would not install in the image, so neither the tag check nor uv's rehearsal may accept it
GLIBC_MINOR = 35
PLATFORM = f"x86_64-manylinux_2_{GLIBC_MINOR}"  # uv's name for that platform
LINUX_X86_64 = [f"manylinux_2_{minor}_x86_64" for minor in range(GLIBC_MINOR, 4, -1)]
LINUX_X86_64 += ["manylinux2014_x86_64", "manylinux2010_x86_64", "manylinux1_x86_64", "linux_x86_64"]


@dataclass(frozen=True)
class Finding:
    pin: str
    host: str
    served: bool
    answer: str

    def line(self) -> str:
        return f"{'ok' if self.served else 'FAILED':<6}  {self.pin}  [{self.host}] {self.answer}"


# ---- the base image -------------------------------------------------------------------------------------


def check_base(http: Http, image: str, digest: str | None) -> Finding:
    pin = f"base {image}" + (f"@{digest}" if digest else "")
    url = registry_manifest_url(image, digest)
    answer = registry_manifest(http, url)
    host = host_of(url)
    if answer.status == 200:
        served = answer.headers.get("Docker-Content-Digest")
        found = f"served ({served})" if served else "served"
        if digest and served and served != digest:
            return Finding(pin, host, False, f"the registry's digest is {served}, not the recipe's")
        return Finding(pin, host, True, found)
    if answer.status == 404:
        return Finding(
            pin,
            host,
            False,
            "not found: the tag was deleted (NVIDIA removes end-of-life CUDA tags); build with --base-image naming "
            "a copy you kept, or from a `verlbox bundle`",
        )
    return Finding(pin, host, False, status_line(answer))


# ---- Python files on a simple index ---------------------------------------------------------------------


class _Links(HTMLParser):
    """The file names a PEP 503 page links to (a link's text may differ from its file: the href decides)."""

    def __init__(self) -> None:
        super().__init__()
        self.files: list[tuple[str, bool]] = []  # (file name, yanked)

    def handle_starttag(self, tag: str, attrs: list[tuple[str, str | None]]) -> None:
        if tag == "a":
            attributes = dict(attrs)
            href = attributes.get("href") or ""
            name = unquote(urlsplit(href).path.rsplit("/", 1)[-1])
            if name:
                self.files.append((name, "data-yanked" in attributes))


def supported_tags(python: str) -> set[tags.Tag]:
    """The wheel tags CPython PYTHON on linux x86_64 installs."""
    version = tuple(int(part) for part in python.split("."))
    found = set(tags.cpython_tags(python_version=version, platforms=LINUX_X86_64))
    found |= set(tags.compatible_tags(python_version=version, platforms=LINUX_X86_64))
    return found


def file_version(name: str, wanted: str) -> tuple[Version, frozenset[tags.Tag] | None] | None:
    """(version, wheel tags) of a distribution file of project WANTED; an sdist has no tags; others: None."""
    try:
        if name.endswith(".whl"):
            project, version, _, file_tags = parse_wheel_filename(name)
            return (version, file_tags) if project == canonicalize_name(wanted) else None
        if name.endswith((".tar.gz", ".zip")):
            project, version = parse_sdist_filename(name)
            return (version, None) if project == canonicalize_name(wanted) else None
    except (InvalidWheelFilename, InvalidSdistFilename, InvalidVersion):
        return None
    return None


def check_on_index(http: Http, index_url: str, name: str, version: str, python: str) -> Finding:
    pin = f"{name}=={version}"
    project = canonicalize_name(name.split("[", 1)[0])
    url = page_url(index_url, project)
    host = host_of(url)
    answer = http.request(url, headers={"Accept": "text/html"})
    if answer.status == 404:
        return Finding(pin, host, False, "the index has no such project")
    if answer.status != 200:
        return Finding(pin, host, False, status_line(answer))
    links = _Links()
    links.feed(answer.body.decode("utf-8", "replace"))
    wanted, supported = Version(version), supported_tags(python)
    files = [(found, yanked) for file, yanked in links.files if (found := file_version(file, project)) is not None]
    matching = [(file_tags, yanked) for (found, file_tags), yanked in files if found == wanted]
    if not matching:
        newest = max((found for (found, _), _ in files), default=None)
        return Finding(pin, host, False, f"no {version} on this index" + (f" (newest: {newest})" if newest else ""))
    usable = [yanked for file_tags, yanked in matching if file_tags is None or file_tags & supported]
    if not usable:
        return Finding(
            pin,
            host,
            False,
            f"{version} is listed, but no file for CPython {python} on linux x86_64, glibc 2.{GLIBC_MINOR}",
        )
    return Finding(
        pin, host, True, "served" + (" (yanked: pip takes it only when pinned, as here)" if all(usable) else "")
    )


# ---- files named by URL, the cuDNN apt pin ---------------------------------------------------------------


# what a host answers a HEAD it does not take (GitHub's signed release downloads have refused it): ask a GET instead
HEAD_REFUSED = {400, 403, 405, 501}


def check_url(http: Http, pin: str, url: str) -> Finding:
    answer = http.request(url, method="HEAD")
    if answer.status in HEAD_REFUSED:  # one byte asked for, and no byte of the answer read
        answer = http.request(url, headers={"Range": "bytes=0-0"}, body=False)
    served = answer.status in (200, 206)
    total = answer.headers.get("Content-Length") if answer.status == 200 else None
    if answer.status == 206:  # Content-Range: bytes 0-0/TOTAL
        total = (answer.headers.get("Content-Range") or "").rpartition("/")[2]
    size = f" ({int(total) / 2**20:.0f} MiB)" if total and total.isdigit() else ""
    return Finding(pin, host_of(url), served, ("served" + size) if served else status_line(answer))


def unpinned_warning(finding: Finding, sha256: str | None) -> Finding:
    """FINDING for a wheel named by URL, saying so when the recipe pins no sha256 for it."""
    if sha256 or not finding.served:
        return finding
    note = "; NOT pinned by sha256 (vllm.wheel_sha256): an unlocked build installs whatever this URL serves"
    return Finding(finding.pin, finding.host, True, finding.answer + note)


def check_archive_pin(http: Http, sources: BuildSources, pin_name: str, archive: ArchivePin) -> Finding:
    """A pinned source archive: in the cache with its hash (as a build takes it), else its URL (HEAD)."""
    cached = sources.archives / archive.name
    if cached.is_file():
        try:
            check_archive(cached, archive)
        except UsageError as error:
            return Finding(pin_name, "cache", False, str(error))
        return Finding(pin_name, "cache", True, "in the source cache, its sha256 as pinned")
    return check_url(http, pin_name, sources.archive_url(archive))


def apt_versions(index: str, packages: set[str]) -> dict[str, set[str]]:
    """PACKAGE -> versions an apt Packages index lists."""
    found: dict[str, set[str]] = {name: set() for name in packages}
    for stanza in index.split("\n\n"):
        fields = dict(re.findall(r"^(Package|Version):\s*(\S+)\s*$", stanza, re.MULTILINE))
        if fields.get("Package") in found and "Version" in fields:
            found[fields["Package"]].add(fields["Version"])
    return found


class Unsigned(Exception):
    """A repository the base's apt would refuse, or whose signature this host cannot check: the finding's answer."""


def gpg(home: str, *arguments: str, data: bytes) -> subprocess.CompletedProcess[bytes]:
    # --no-autostart: nothing here needs a secret key, so no gpg-agent (nor keyboxd) starts and outlives the check
    command = ["gpg", "--homedir", home, "--batch", "--no-autostart", "--no-tty", *arguments]
    return subprocess.run(command, input=data, capture_output=True, check=False)


def primary_fingerprints(home: str, key_file: bytes) -> list[str]:
    """The primary keys' fingerprints in KEY_FILE (armored or not), read without importing it anywhere."""
    listed = gpg(home, "--with-colons", "--show-keys", data=key_file)
    fingerprints: list[str] = []
    after_primary = False
    for record in listed.stdout.decode("utf-8", "replace").splitlines():
        fields = record.split(":")
        if fields[0] == "fpr" and after_primary and len(fields) > 9:
            fingerprints.append(fields[9].upper())
        after_primary = fields[0] == "pub"
    return fingerprints if listed.returncode == 0 else []


def signed_by(status: str, key: str) -> str | None:
    """None when gpgv's --status-fd STATUS holds a good signature by KEY and no bad one (apt's rule: a second
    signature by a key it lacks, as while a repository changes keys, does not count against it); else why not."""
    signatures = [part.splitlines() for part in ("\n" + status).split("\n[GNUPG:] NEWSIG")[1:]]
    records = [[line.split()[1:] for line in lines if line.startswith("[GNUPG:] ")] for lines in signatures]
    if any(fields[0] == "BADSIG" for signature in records for fields in signature if fields):
        return " (its signature does not match its text: changed after signing)"
    for signature in records:
        kinds = {fields[0] for fields in signature if fields}
        # VALIDSIG's last field is the signing key's primary fingerprint (a subkey of KEY may sign for it)
        primaries = {fields[-1] for fields in signature if fields and fields[0] == "VALIDSIG"}
        if "GOODSIG" in kinds and key in primaries:
            return None
    signers = [fields[1] for signature in records for fields in signature if fields[:1] == ["ERRSIG"]]
    if signers:
        return f" (it is signed by key {', '.join(signers)})"
    if not records:
        return " (it holds no signature)"
    lapsed = any(fields[:1] in (["EXPKEYSIG"], ["REVKEYSIG"]) for signature in records for fields in signature)
    return " (by an expired or revoked key)" if lapsed else ""


def verified_release(http: Http, repository: str, key: str) -> str:
    """The text of REPOSITORY's InRelease that KEY (a fingerprint) signed, checked as the base's apt checks it: with
    only the key the base's cuda-keyring trusts, taken from the repository's KEY_ID.pub when its fingerprint is KEY."""
    missing = [tool for tool in ("gpg", "gpgv") if shutil.which(tool) is None]
    if missing:
        raise Unsigned(f"{' and '.join(missing)} not found: install gnupg and gpgv to check the repository's signature")
    release = http.request(f"{repository}/InRelease")
    if release.status != 200:
        raise Unsigned(f"its InRelease: {status_line(release)} (the base's apt takes only a signed repository)")
    key_name = f"{key[-8:].lower()}.pub"  # NVIDIA serves each key by its short id (a rotated one by a new name)
    served = http.request(f"{repository}/{key_name}")
    if served.status != 200:
        raise Unsigned(
            f"its signing key {key_name}: {status_line(served)} (NVIDIA serves a rotated key by another name: "
            "the base's cuda-keyring may no longer match the repository)"
        )
    with tempfile.TemporaryDirectory(prefix="verlbox-gnupg-") as home:
        fingerprints = primary_fingerprints(home, served.body)
        if not fingerprints:
            raise Unsigned(f"its {key_name} holds no OpenPGP public key")
        if key not in fingerprints:
            raise Unsigned(
                "the repository's key changed (NVIDIA rotated it in 2022): the base's cuda-keyring will not trust it; "
                f"{key_name} is {', '.join(fingerprints)}, not the pinned {key}: take a base whose cuda-keyring holds "
                "the new key, and pin that (cudnn.repository_key)"
            )
        folder = Path(home)
        (folder / "keyring.gpg").write_bytes(gpg(home, "--dearmor", data=served.body).stdout)
        (folder / "InRelease").write_bytes(release.body)
        command = ["gpgv", "--homedir", home, "--keyring", str(folder / "keyring.gpg"), "--status-fd", "1"]
        checked = subprocess.run(
            [*command, "--output", str(folder / "signed"), str(folder / "InRelease")], capture_output=True, check=False
        )
        problem = signed_by(checked.stdout.decode("utf-8", "replace"), key)
        if problem is not None:
            refused = f"its InRelease is not signed by the pinned key {key}{problem}"
            raise Unsigned(f"{refused}: the base's apt would refuse the repository")
        return (folder / "signed").read_text("utf-8", "replace")


def listed_sha256(release: str, name: str) -> str | None:
    """The sha256 a Release file's SHA256 section gives file NAME."""
    section = re.search(r"^SHA256:[ \t]*\n((?:[ \t]+\S.*(?:\n|$))*)", release, re.MULTILINE)
    for line in section.group(1).splitlines() if section else []:
        fields = line.split()
        if len(fields) == 3 and fields[2] == name:
            return fields[0].lower()
    return None


def check_apt_pin(http: Http, repository_url: str, packages: dict[str, str], key: str) -> Finding:
    """PACKAGES (name -> version) in the repository's Packages.gz, taken only when the InRelease signed by KEY (the
    fingerprint the base's cuda-keyring trusts) lists its sha256."""
    pin = " ".join(f"{name}={version}" for name, version in packages.items())
    repository = repository_url.rstrip("/")
    url = f"{repository}/Packages.gz"
    host = host_of(url)
    try:
        listed = listed_sha256(verified_release(http, repository, key), "Packages.gz")
    except Unsigned as refused:
        return Finding(pin, host, False, str(refused))
    if listed is None:
        return Finding(pin, host, False, "its signed InRelease lists no sha256 of Packages.gz")
    answer = http.request(url)
    if answer.status != 200:
        return Finding(pin, host, False, f"its Packages index: {status_line(answer)}")
    if (served := hashlib.sha256(answer.body).hexdigest()) != listed:
        return Finding(
            pin,
            host,
            False,
            f"its Packages.gz is not the one its signed InRelease lists (sha256 {served}, listed {listed}): a changed "
            "file, or a mirror caught mid-update",
        )
    try:
        index = gzip.decompress(answer.body).decode("utf-8", "replace")
    except (OSError, EOFError, zlib.error):
        return Finding(pin, host, False, "its Packages.gz is not a whole gzip file")
    listed_versions = apt_versions(index, set(packages))
    missing = [f"{name}={version}" for name, version in packages.items() if version not in listed_versions[name]]
    if missing:
        return Finding(pin, host, False, f"not in the repository's index: {', '.join(missing)}")
    return Finding(pin, host, True, f"listed in the repository's Packages index, signed by its pinned key {key[-8:]}")


# ---- one resolution of the final stage -------------------------------------------------------------------


def uv_binary() -> str:
    from uv import find_uv_bin

    return find_uv_bin()


UV_TREE = " \u00d7\u2570\u251c\u2500\u25b6\u2502"  # the marks uv draws its explanation with
# uv --no-build names a package it would have to build, one or a few per run: "X==V has no usable wheels" (or a
# range, "X>=V1,<=V2 ...", whose top is the version a resolver takes) and "Wheels are required for `X`" (its
# message is wrapped: read with its lines joined)
NO_USABLE_WHEELS = re.compile(r"([A-Za-z0-9][A-Za-z0-9._-]*)(?:\[[^\]]*\])?([<>=!~][^\s]*) has no usable wheels")
WHEELS_REQUIRED = re.compile(r"Wheels are required for `([^`]+)`")
SDIST_ONLY_RUNS = 12  # resolutions in all: each may name more sdist-only packages


def stub_wheel(folder: Path, name: str, version: str) -> None:
    """A wheel of NAME VERSION holding only metadata that requires nothing: what uv resolves an sdist-only package
    with instead of building it (its build would run the index's code on this host)."""
    stem = f"{name.replace('-', '_')}-{version}"
    metadata = f"Metadata-Version: 2.1\nName: {name}\nVersion: {version}\n"
    wheel = "Wheel-Version: 1.0\nGenerator: verlbox-check\nRoot-Is-Purelib: true\nTag: py3-none-any\n"
    with zipfile.ZipFile(folder / f"{stem}-py3-none-any.whl", "w") as archive:
        archive.writestr(f"{stem}.dist-info/METADATA", metadata)
        archive.writestr(f"{stem}.dist-info/WHEEL", wheel)
        archive.writestr(f"{stem}.dist-info/RECORD", "")


def sdist_only(explanation: str) -> tuple[dict[str, str], list[str]]:
    """From uv's explanation: the packages it would have to build, name -> the version it would take (an exact
    pin, or a range's inclusive top), and those it names without one (which no stub can stand in for)."""
    names = {canonicalize_name(name) for name in WHEELS_REQUIRED.findall(explanation)}
    versions: dict[str, str] = {}
    for name, specifiers in NO_USABLE_WHEELS.findall(explanation):
        try:
            tops = [Version(s.version) for s in SpecifierSet(specifiers.rstrip(",")) if s.operator in ("==", "<=")]
        except (InvalidSpecifier, InvalidVersion):
            continue
        if tops:
            versions[canonicalize_name(name)] = str(max(tops))
    return {name: versions[name] for name in names if name in versions}, sorted(names - versions.keys())


def check_resolution(
    requirements: list[str],
    python: str,
    index_url: str,
    extra_index_url: str | None,
    sources: BuildSources,
    timeout: float,
) -> Finding:
    """The requirements resolved once by uv, which never builds (an sdist's build runs code from the index) nor
    fetches a Python. A package served only as an sdist is resolved from a stub wheel without its own
    dependencies, and the finding names it."""
    pin = f"the final stage's {len(requirements)} pins, resolved together"
    host = host_of(index_url) + (f", {host_of(extra_index_url)}" if extra_index_url else "")
    command = [uv_binary(), "pip", "compile", "-", "--quiet", "--no-header", "--python-version", python]
    command += ["--python-platform", PLATFORM, "--index-strategy", "unsafe-best-match"]
    command += ["--no-build", "--no-python-downloads"]
    env = os.environ | {"UV_HTTP_TIMEOUT": str(int(max(timeout, 1))), "UV_NO_CONFIG": "1", "NO_COLOR": "1"}
    env |= {"UV_PYTHON_DOWNLOADS": "never"}
    # the indexes in uv's environment, never its command line (`ps` shows that, and a URL may hold a token)
    env |= {"UV_INDEX_URL": index_url} | ({"UV_EXTRA_INDEX_URL": extra_index_url} if extra_index_url else {})
    env |= {"SSL_CERT_FILE": str(sources.ca_bundle)} if sources.ca_bundle else {}
    stubbed: dict[str, str] = {}
    with tempfile.TemporaryDirectory(prefix="verlbox-check-") as stubs:
        for _ in range(SDIST_ONLY_RUNS):
            result = subprocess.run(
                [*command, "--find-links", stubs],
                input="\n".join(requirements) + "\n",
                capture_output=True,
                text=True,
                env=env,
                check=False,
            )
            if result.returncode == 0:
                break
            lines = [line.strip(UV_TREE) for line in result.stderr.splitlines()]
            # uv's own warnings (a managed Python it may not fetch, say) are not why the resolution failed
            said = [line for line in lines if line and not line.startswith(("No solution found", "warning:"))]
            reason = " ".join(said)
            # uv names the index in its errors: its login, path and query (a token may ride there) are never shown
            for secret, shown in secret_parts(env):
                reason = reason.replace(secret.decode(), shown.decode())
            found, unversioned = sdist_only(reason)
            if unversioned:
                return Finding(
                    pin,
                    host,
                    False,
                    f"{', '.join(unversioned)}: only sdists, and uv named no one version of them to resolve without "
                    "a build (--check builds nothing: a build runs the index's code)",
                )
            if not found or found.keys() & stubbed.keys():  # no sdist to stand in for, or a stub did not help
                return Finding(pin, host, False, reason or f"uv failed (exit {result.returncode})")
            for name, version in found.items():
                stub_wheel(Path(stubs), name, version)
            stubbed |= found
        else:
            return Finding(pin, host, False, f"uv still named sdist-only packages after {SDIST_ONLY_RUNS} runs")
    resolved = dict(re.findall(r"^([A-Za-z0-9._-]+)==(\S+)", result.stdout, re.MULTILINE))
    numpy = f", numpy {resolved['numpy']}" if "numpy" in resolved else ""
    answer = f"one consistent set of {len(resolved)} packages for CPython {python}{numpy}"
    if stubbed:
        named = ", ".join(f"{name} {version}" for name, version in sorted(stubbed.items()))
        answer += (
            f"; sdist only, not built and so resolved without their own dependencies (reading them needs a build, "
            f"which --check never runs): {named}"
        )
    return Finding(pin, host, True, answer)


# ---- the recipe ------------------------------------------------------------------------------------------


def final_requirements(recipe: RecipeHead, *, url_wheels: bool = True) -> list[str]:
    """Every requirement the final image's pip steps name, in one list (vLLM by its wheel URL when the
    recipe names one and URL_WHEELS)."""
    requirements = [*recipe.torch.requirements()]  # type: ignore[attr-defined]
    if vllm := getattr(recipe, "vllm", None):
        requirements.append(f"vllm @ {vllm.wheel_url}" if vllm.wheel_url and url_wheels else f"vllm=={vllm.version}")
    requirements += [f"verl=={recipe.verl.version}", *recipe.verl.requirements()]  # type: ignore[attr-defined]
    requirements += recipe.runtime.pins_as_requirements()  # type: ignore[attr-defined]
    return requirements


def default_pip_index(sources: BuildSources) -> str:
    """The index a build's pip uses: the build's own, else this host's pip's (its configuration or default)."""
    if sources.pip_index_url:
        return sources.pip_index_url
    if os.environ.get("PIP_INDEX_URL"):
        return os.environ["PIP_INDEX_URL"]
    try:
        from pip._internal.configuration import Configuration
        from pip._internal.models.index import PyPI

        configuration = Configuration(isolated=False)
        configuration.load()
        return dict(configuration.items()).get("global.index-url") or PyPI.simple_url
    except Exception as error:  # pip's internals: any failure means only that it cannot tell
        raise UsageError("cannot tell which package index this host's pip uses: give --pip-index-url") from error


def check_recipe(
    recipe: RecipeHead, sources: BuildSources, *, nvidia_repo_url: str = NVIDIA_CUDA_REPOS, timeout: float = 20
) -> list[Finding]:
    """Every pin of RECIPE asked of its upstream, in the recipe's order; each failure is a Finding, not an error."""
    http = Http(sources.ca_bundle, timeout)
    python = recipe.python.version  # type: ignore[attr-defined]
    pip_index = default_pip_index(sources)
    torch = recipe.torch  # type: ignore[attr-defined]
    torch_index = sources.torch_index_url if torch.index else None
    base = recipe.base
    base_url = registry_manifest_url(base.image, base.digest)
    checks: list[tuple[str, str, Callable[[], Finding]]] = [
        (f"base {base.image}", base_url, lambda: check_base(http, base.image, base.digest))
    ]

    def on_index(index: str, name: str, version: str) -> tuple[str, str, Callable[[], Finding]]:
        return (f"{name}=={version}", index, lambda: check_on_index(http, index, name, version, python))

    python_component = recipe.python  # type: ignore[attr-defined]
    checks += [on_index(pip_index, "pip", python_component.pip), on_index(pip_index, "uv", python_component.uv)]
    checks += [on_index(torch_index or pip_index, name, version) for name, version in torch.pins().items()]
    if cudnn := getattr(recipe, "cudnn", None):
        repository = f"{nvidia_repo_url.rstrip('/')}/{cudnn.repository}"
        packages = {"libcudnn8": cudnn.apt_version, "libcudnn8-dev": cudnn.apt_version}
        key = cudnn.repository_key
        checks.append(("cudnn", repository, lambda: check_apt_pin(http, repository, packages, key)))
    if vllm := getattr(recipe, "vllm", None):
        if vllm.wheel_url:
            checks.append(
                (
                    f"vllm=={vllm.version}",
                    vllm.wheel_url,
                    lambda: unpinned_warning(
                        check_url(http, f"vllm=={vllm.version}", vllm.wheel_url), vllm.wheel_sha256
                    ),
                )
            )
        else:
            checks.append(on_index(pip_index, "vllm", vllm.version))
    checks.append(on_index(pip_index, "verl", recipe.verl.version))  # type: ignore[attr-defined]
    checks += [on_index(pip_index, name, version) for name, version in recipe.verl.dependencies.items()]  # type: ignore[attr-defined]
    if apex := getattr(recipe, "apex", None):
        checks += [on_index(pip_index, name, version) for name, version in apex.build_requirements.items()]
        pin, archive = f"apex {apex.commit[:12]} archive", apex.archive_pin()
        checks.append((pin, sources.archive_url(archive), lambda: check_archive_pin(http, sources, pin, archive)))
    checks += [on_index(pip_index, name, version) for name, version in recipe.runtime.requirements.items()]  # type: ignore[attr-defined]
    resolution = final_requirements(recipe)
    checks.append(
        (
            "resolution",
            pip_index,
            lambda: check_resolution(resolution, python, pip_index, torch_index, sources, timeout),
        )
    )

    unique = list({(pin, where): (pin, where, ask) for pin, where, ask in checks}.values())  # setuptools twice
    with ThreadPoolExecutor(max_workers=8) as pool:
        return list(pool.map(lambda check: asked(*check), unique))


def asked(pin: str, where: str, ask: Callable[[], Finding]) -> Finding:
    """ASK's finding; a host that gave no usable answer is a failed finding for PIN at WHERE, not an error."""
    try:
        return ask()
    except UpstreamError as error:
        return Finding(pin, host_of(where), False, str(error))


def print_findings(findings: list[Finding], print_line: Callable[[str], None]) -> int:
    """One line per pin, then one summary line; 0 when every pin is served, else 1."""
    for finding in findings:
        print_line(finding.line())
    failed = [finding for finding in findings if not finding.served]
    print_line(
        f"{len(findings) - len(failed)} of {len(findings)} served" + (f"; {len(failed)} failed" if failed else "")
    )
    return 1 if failed else 0
