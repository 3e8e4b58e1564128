"""verlbox's build steps inside an image: every installing RUN of a rendered Dockerfile runs one command of
this module (through steps.sh, which only makes sure there is a python3 to run it with).

    apt [--apt-get-option=OPT]... STEP PACKAGE...      Debian packages (the lock's name=version when it has STEP)
    pip [--index=torch] [--extra-index=torch] STEP [PIP ARGUMENT]...   Python packages (the lock's files)
    toolkit SUITE --component=C... PACKAGE=VERSION...  .debs of another Debian suite, unpacked at / (no dpkg)
    bundle-wheels DEST                                 every Python file the lock names, for `verlbox bundle`
    bundle-debs DEST INDEXES                           the image's locked .debs and Debian's signed indexes
    --offline COMMAND ...                              from the bundle's files only (`verlbox build --offline`)

Standard library only, and Python 3.9 and later: it runs before verlbox (or any other package) is in the
image. The build's secrets (BuildKit mounts them at /run/secrets) are read here and handed to apt, pip
and uv as options, environment variables or files that this step removes: never on a command line that
`ps` shows, never in a file the layer keeps. What each step installed is recorded (build_record.py).
"""

from __future__ import annotations

import argparse
import base64
import hashlib
import http.client
import importlib.metadata as metadata
import json
import os
import re
import shutil
import ssl
import subprocess
import sys
import tempfile
import urllib.request
from collections.abc import Iterator
from concurrent.futures import ThreadPoolExecutor
from contextlib import contextmanager
from dataclasses import dataclass
from html.parser import HTMLParser
from pathlib import Path
from typing import Any
from urllib.parse import unquote, urljoin, urlsplit, urlunsplit

try:  # in a build step, build_record.py and urls.py are mounted beside this file; verlbox is not installed yet
    import build_record  # type: ignore[import-not-found]
    import urls  # type: ignore[import-not-found]
except ImportError:
    from verlbox.runtime.steps import build_record, urls

SECRETS = Path("/run/secrets")
TOOLS = Path("/tmp/verlbox")
# the files locked steps install, by sha256, kept between builds (a BuildKit cache mount): every file is hashed
# again each time it is used, so what another build wrote there is used only if it is the lock's bytes
LOCKED_FILES = Path("/root/.cache/verlbox/locked-files")
DEBIAN_KEYRING = "/usr/share/keyrings/debian-archive-keyring.gpg"
# where a glue-installed python3 left the step's "before" list (steps.sh): the step's record starts there
BOOTSTRAP_BEFORE = Path("/tmp/verlbox-dpkg-before")


class StepError(Exception):
    """A step that cannot go on: one line for the build log, exit 1."""


@dataclass(frozen=True)
class Secrets:
    ca_bundle: Path | None = None
    pip_index_url: str | None = None
    torch_index_url: str | None = None
    apt_mirror: str | None = None

    @classmethod
    def read(cls, folder: Path = SECRETS) -> Secrets:
        def text(name: str) -> str | None:
            path = folder / name
            return path.read_text().strip() or None if path.is_file() else None

        ca = folder / "ca_bundle"
        return cls(
            ca_bundle=ca if ca.is_file() and ca.stat().st_size else None,
            pip_index_url=text("pip_index_url"),
            torch_index_url=text("torch_index_url"),
            apt_mirror=text("apt_mirror"),
        )


def run(command: list[str], *, env: dict[str, str] | None = None, cwd: Path | None = None) -> None:
    """COMMAND's output goes to the build log (it says what went wrong), with the secret parts of the index
    URLs in ENV replaced (pip prints an index's path and query, where a token may ride); a failure stops the step."""
    hidden = secret_parts(env or {})
    if not hidden:
        returncode = subprocess.run(command, env=env, cwd=cwd, check=False).returncode
    else:
        with subprocess.Popen(command, env=env, cwd=cwd, stdout=subprocess.PIPE, stderr=subprocess.STDOUT) as child:
            assert child.stdout is not None
            for line in child.stdout:
                for secret, shown in hidden:
                    line = line.replace(secret, shown)
                sys.stdout.buffer.write(line)
                sys.stdout.flush()
        returncode = child.returncode
    if returncode != 0:
        raise StepError(f"{Path(command[0]).name} failed (exit {returncode})")


INDEX_VARIABLES = ("PIP_INDEX_URL", "PIP_EXTRA_INDEX_URL", "UV_INDEX_URL", "UV_EXTRA_INDEX_URL")


def secret_parts(env: dict[str, str]) -> list[tuple[bytes, bytes]]:
    """What no log may show of the index URLs in ENV, each with what is shown instead: each one's credentials
    (as given and decoded), its query and fragment (`***`), and its path after its host (`host/***`: a token may
    ride there, `https://host/TOKEN/simple/`). Longest first, so that a part of another is never replaced before it."""
    parts: dict[str, str] = {}
    for url in (url for name in INDEX_VARIABLES for url in env.get(name, "").split()):
        try:
            bare, userinfo = urls.split_userinfo(url)
        except ValueError:  # a URL no tool can use: hidden whole
            parts[url] = "***"
            continue
        if userinfo:
            parts |= dict.fromkeys({userinfo, *urls.login(userinfo)[1:]}, "***")
        parts |= dict.fromkeys((piece for piece in re.split(r"[?#]", bare)[1:] if piece), "***")
        where = urlsplit(urls.redact(url))
        if path := where.path.strip("/"):
            parts[f"{where.netloc}/{path}"] = f"{where.netloc}/***"
    ordered = sorted((secret for secret in parts if secret), key=len, reverse=True)
    return [(secret.encode(), parts[secret].encode()) for secret in ordered]


# ---- Python packages ----------------------------------------------------------------------------------


def pip_environment(
    secrets: Secrets, *, offline: bool, index: str | None, extra_index: str | None, base: dict[str, str]
) -> dict[str, str]:
    """pip's and uv's settings for one step: the CA, the index (the build's, or torch's for INDEX=torch),
    or offline the bundle's wheels only, with no cache (a cache would be written into the layer)."""
    env = dict(base)
    if secrets.ca_bundle:
        env |= {name: str(secrets.ca_bundle) for name in ("PIP_CERT", "SSL_CERT_FILE", "GIT_SSL_CAINFO")}
    if offline:
        return from_folder(env, TOOLS / "wheels")
    # without the build's own, uv follows an index the image's environment gives pip (a base's ENV)
    primary = secrets.torch_index_url if index == "torch" else secrets.pip_index_url or base.get("PIP_INDEX_URL")
    extra = secrets.torch_index_url if extra_index == "torch" else base.get("PIP_EXTRA_INDEX_URL")
    if index == "torch" and not primary:
        raise StepError("the recipe's torch index has no URL in this build (the torch_index_url secret)")
    if primary:
        env |= {"PIP_INDEX_URL": primary, "UV_INDEX_URL": primary}
    if extra:
        env |= {"PIP_EXTRA_INDEX_URL": extra, "UV_EXTRA_INDEX_URL": extra}
    return env


def install_python(
    step: str,
    arguments: list[str],
    env: dict[str, str],
    *,
    offline: bool,
    tools: Path = TOOLS,
    records: Path = build_record.RECORD_DIR,
) -> None:
    """With the lock's slice for STEP: exactly its files, by hash, with no resolver (uv where the image has
    it: about 5x faster than pip here, docs/benchmarks.md), and the slice becomes the step's record.
    Without one: pip resolves ARGUMENTS and its --report becomes the record (what `verlbox lock` reads)."""
    requirements, record = tools / "lock" / f"{step}.pip.txt", tools / "lock" / f"{step}.pip.json"
    if requirements.is_file():
        entries = json.loads(record.read_text())
        # each file by name and version from a folder of the lock's bytes: offline the bundle's, online the
        # files fetched by their sha256 (a file the lock names by URL is fetched from it)
        lines = build_record.requirement_lines([{k: v for k, v in entry.items() if k != "url"} for entry in entries])
        wheels, sdists = locked_slices(step, entries, lines)
        with tempfile.TemporaryDirectory(prefix="verlbox-locked-") as scratch:
            if not offline:
                env = from_folder(env, link_files(fetch_locked(entries, LOCKED_FILES, env), Path(scratch)))
            for part, sources in ((wheels, False), (sdists, True)):
                if part:
                    install_locked(part, env, sources=sources)
        if shutil.which("uv"):
            compile_bytecode([entry["name"] for entry in entries], int(env.get("SOURCE_DATE_EPOCH") or 0))
        build_record.write_record(step, "pip", entries, records)
        record_installed(step, [entry["name"] for entry in entries], env, records)
    elif offline:
        raise StepError(f"the lock has no Python files for step {step}: an offline build installs only the lock")
    else:
        options = pip_with_report(arguments, env)
        with tempfile.TemporaryDirectory() as scratch:
            report = Path(scratch) / "report.json"
            run([sys.executable, "-m", "pip", "install", *options, "--report", str(report), *arguments], env=env)
            entries = build_record.pip_record(json.loads(report.read_text()))
            build_record.write_record(step, "pip", entries, records)
            record_installed(step, [entry["name"] for entry in entries], env, records)


def record_installed(step: str, names: list[str], env: dict[str, str], records: Path) -> None:
    """The step's distributions as installed in the environment pip and uv installed into (ENV's venv)."""
    venv = env.get("VIRTUAL_ENV")
    where = sorted(str(path) for path in Path(venv).glob("lib/python*/site-packages")) if venv else None
    try:
        build_record.write_installed(step, names, where, records)
    except LookupError as error:
        raise StepError(str(error)) from None


def locked_slices(step: str, entries: list[dict], lines: list[str]) -> tuple[list[str], list[str]]:
    """STEP's requirement LINES (one per lock entry, in order) split into its wheels and its sdists."""
    if len(lines) != len(entries):
        raise StepError(f"the lock's slice for step {step} has {len(lines)} lines for {len(entries)} files")
    wheels: list[str] = []
    sdists: list[str] = []
    for index, entry in enumerate(entries):  # no zip(strict=): this runs on Python 3.9
        (wheels if entry["file"].endswith(".whl") else sdists).append(lines[index])
    return wheels, sdists


def install_locked(lines: list[str], env: dict[str, str], *, sources: bool) -> None:
    """Install LINES (`NAME==VERSION --hash=...`) by hash, without dependencies, running no code the lock
    does not pin. Wheels: building is refused outright. Sdists: built without build isolation, so with the
    build tools the lock already installed (the step's wheels go first): an isolated build would fetch its
    backend (setuptools, wheel) unhashed from the index or the bundle's folder, and run it."""
    build = ["--no-build-isolation"] if sources else None
    with tempfile.TemporaryDirectory() as scratch:
        requirements = Path(scratch) / "requirements.txt"
        requirements.write_text("\n".join(lines) + "\n")
        if shutil.which("uv"):
            # uv leaves lock files with random names in its temporary folder (from building an sdist): a
            # folder of its own keeps them out of the layer. Its --compile-bytecode would compile the whole
            # environment at every step (about 35 s each here): compile_bytecode does this step's files.
            command = ["uv", "pip", "install", "--no-deps", "--require-hashes", *(build or ["--no-build"])]
            run([*command, "-r", str(requirements)], env=env | {"TMPDIR": scratch, "UV_LINK_MODE": "copy"})
        else:
            command = [sys.executable, "-m", "pip", "install", "--no-deps", "--require-hashes"]
            run([*command, *(build or ["--only-binary", ":all:"]), "-r", str(requirements)], env=env)


def from_folder(env: dict[str, str], folder: Path) -> dict[str, str]:
    """ENV for pip and uv installing only from FOLDER's files: no index, and no cache (what a cache holds was
    written by whatever ran before, and uv trusts an unpacked entry by the hash it recorded for it)."""
    env = {name: value for name, value in env.items() if name not in INDEX_VARIABLES}
    env |= {"PIP_NO_INDEX": "1", "PIP_FIND_LINKS": str(folder), "PIP_NO_CACHE_DIR": "1"}
    return env | {"UV_OFFLINE": "1", "UV_NO_INDEX": "1", "UV_FIND_LINKS": str(folder), "UV_NO_CACHE": "1"}


HTTP = ("http", "https")


class _Links(HTMLParser):
    """The links of a PEP 503 project page."""

    def __init__(self) -> None:
        super().__init__()
        self.hrefs: list[str] = []

    def handle_starttag(self, tag: str, attrs: list[tuple[str, str | None]]) -> None:
        href = dict(attrs).get("href")
        if tag == "a" and href:
            self.hrefs.append(href)


def configured_indexes() -> list[str]:
    """The indexes this image's pip uses when the build names none: its configuration's (global or install
    section), else pip's default, then the configuration's extra indexes."""
    try:
        from pip._internal.configuration import Configuration
        from pip._internal.models.index import PyPI
    except ImportError:
        raise StepError("no index URL for the lock's files, and no pip here to tell its default") from None
    configuration = Configuration(isolated=False)
    configuration.load()
    items = dict(configuration.items())
    primary = items.get("global.index-url") or items.get("install.index-url") or PyPI.simple_url
    extra = items.get("global.extra-index-url") or items.get("install.extra-index-url") or ""
    return [primary, *extra.split()]


class Fetcher:
    """GETs for the lock's files: the build's CA, the environment's proxy, and an index's login sent only to
    the scheme, host and port its URL names (never to a host a page links to, over http to that host, nor
    after a redirect). A page on a remote index may link only remote files (a `file:` link would read this
    machine's files)."""

    def __init__(self, env: dict[str, str]) -> None:
        cafile = env.get("PIP_CERT") or env.get("SSL_CERT_FILE")
        self.opener = urllib.request.build_opener(
            urllib.request.HTTPSHandler(context=ssl.create_default_context(cafile=cafile))
        )
        primary = [env["PIP_INDEX_URL"]] if env.get("PIP_INDEX_URL") else configured_indexes()
        self.indexes = [*primary, *env.get("PIP_EXTRA_INDEX_URL", "").split()]
        self.logins: dict[tuple[str, str], str] = {}
        # an index that takes its token in the query: the token goes with every URL of its own scheme, host and
        # port that has no query of its own (a page's relative file links lose the page's query), never elsewhere
        self.queries: dict[tuple[str, str], str] = {}
        for index in self.indexes:
            try:
                bare, userinfo = urls.split_userinfo(index)
            except ValueError as error:
                raise StepError(f"an index URL of this build: {error}") from None
            where = urlsplit(bare)
            if userinfo:
                self.logins[(where.scheme, where.netloc)] = base64.b64encode(
                    ":".join(urls.login(userinfo)).encode()
                ).decode()
            if where.query:
                self.queries.setdefault((where.scheme, where.netloc), where.query)
        self.pages: dict[str, list[str]] = {}
        self.failures: dict[str, str] = {}  # page -> why it could not be read (a 404 aside)

    def open(self, url: str) -> Any:  # urllib's response (its class differs by scheme)
        try:
            bare = urls.split_userinfo(url)[0]
        except ValueError as error:  # a link an index served, say
            raise StepError(f"a URL of this build's indexes: {error}") from None
        where = urlsplit(bare)
        if where.scheme == "file" and Path(unquote(where.path)).is_dir():
            bare = bare.rstrip("/") + "/index.html"
        elif not where.query and (query := self.queries.get((where.scheme, where.netloc))):
            bare = urlunsplit(where._replace(query=query))
        request = urllib.request.Request(bare, headers={"Accept": "text/html", "User-Agent": "verlbox-build-steps"})
        if login := self.logins.get((where.scheme, where.netloc)):
            request.add_unredirected_header("Authorization", f"Basic {login}")
        try:
            return self.opener.open(request, timeout=120)
        except (OSError, ValueError) as error:  # urllib's errors are OSErrors; the URL is shown without secrets
            raise StepError(f"{self.shown(url)}: {getattr(error, 'reason', None) or error}") from None

    def shown(self, url: str) -> str:
        """URL as a message shows it: no login, query or fragment, and no index's path (urls.shown_under)."""
        return urls.shown_under(url, self.indexes)

    def read(self, url: str) -> tuple[bytes, str]:
        """URL's whole body, and the URL it was served from (a redirect may have moved it)."""
        with self.open(url) as answer:
            try:
                return answer.read(), answer.geturl()
            except (OSError, http.client.HTTPException) as error:
                raise StepError(f"{self.shown(url)}: {error or type(error).__name__}") from None

    def links(self, index: str, name: str) -> list[str]:
        """The absolute URLs project NAME's page on INDEX links to (none where the index has no such page)."""
        page = urls.page_url(index, re.sub(r"[-_.]+", "-", name).lower())
        if page not in self.pages:
            self.pages[page] = []
            try:
                body, served = self.read(page)
            except StepError as error:
                if not re.search(r": (Not Found|Gone)$|No such file", str(error)):
                    self.failures[page] = str(error)
                return []
            parser = _Links()
            parser.feed(body.decode("utf-8", "replace"))
            remote = urlsplit(index).scheme != "file"
            links = [urljoin(served, href) for href in parser.hrefs]
            self.pages[page] = [link for link in links if not (remote and urlsplit(link).scheme not in HTTP)]
        return self.pages[page]

    def where(self, entry: dict) -> str:
        """The URL of ENTRY's file: the lock's own, else the first index page that links to a file of that name."""
        if "url" in entry:
            return entry["url"]
        for index in self.indexes:
            for link in self.links(index, entry["name"]):
                if unquote(urlsplit(link).path.rsplit("/", 1)[-1]) == entry["file"]:
                    return link
        why = "; ".join(self.failures.values())
        raise StepError(
            f"{entry['file']}: no index of this build lists it (the lock's {entry['name']} {entry['version']})"
            + (f"; {why}" if why else "")
        )

    def download(self, entry: dict, target: Path) -> None:
        """ENTRY's file into TARGET, only if its bytes are the lock's sha256."""
        partial = target.with_name(target.name + ".part")
        digest = hashlib.sha256()
        url = self.where(entry)
        try:
            with self.open(url) as answer, partial.open("wb") as out:
                while chunk := answer.read(1 << 20):
                    digest.update(chunk)
                    out.write(chunk)
        except (OSError, http.client.HTTPException) as error:
            partial.unlink(missing_ok=True)
            raise StepError(f"{entry['file']} from {self.shown(url)}: {error or type(error).__name__}") from None
        if digest.hexdigest() != entry["sha256"]:
            partial.unlink()
            raise StepError(
                f"{entry['file']}: served with sha256 {digest.hexdigest()}, the lock's is {entry['sha256']}"
            )
        partial.replace(target)


def file_sha256(path: Path) -> str:
    digest = hashlib.sha256()
    with path.open("rb") as data:
        while chunk := data.read(1 << 20):
            digest.update(chunk)
    return digest.hexdigest()


def fetch_locked(entries: list[dict], folder: Path, env: dict[str, str]) -> list[Path]:
    """Each locked file in FOLDER/SHA256/FILE: one already there is kept only if it hashes to the lock's sha256
    (else fetched again), a missing one is fetched from the build's indexes by its name, checked the same way.
    Nothing is built or run: an sdist is only a file here."""
    fetcher = Fetcher(env) if entries else None

    def one(entry: dict) -> tuple[Path, bool]:
        target = folder / entry["sha256"] / entry["file"]
        if target.is_file() and file_sha256(target) == entry["sha256"]:
            return target, False
        if target.parent.is_symlink() or target.parent.is_file():  # planted by another build: never followed
            target.parent.unlink()
        elif target.parent.exists():
            shutil.rmtree(target.parent)
        target.parent.mkdir(parents=True)
        assert fetcher is not None
        fetcher.download(entry, target)
        return target, True

    unique = list({entry["sha256"]: entry for entry in entries}.values())  # a file two steps install
    with ThreadPoolExecutor(max_workers=8) as pool:
        done = list(pool.map(one, unique))
    fetched = sum(new for _, new in done)
    size = sum(path.stat().st_size for path, _ in done) / 2**20
    kept = len(done) - fetched
    # flushed: the installer's output, which follows, goes straight to the same log
    print(f"verlbox: {len(done)} locked files ({size:.0f} MiB) by sha256: {fetched} fetched, {kept} kept", flush=True)
    return [path for path, _ in done]


def link_files(files: list[Path], folder: Path) -> Path:
    """FOLDER holding links to exactly FILES (an installer's find-links sees this step's files and no other)."""
    for path in files:
        (folder / path.name).symlink_to(path)
    return folder


def pip_with_report(arguments: list[str], env: dict[str, str]) -> list[str]:
    """Extra options for a recorded install. pip added --report in 22.2; a venv made by an older
    distribution's python3 (Ubuntu 22.04's is pip 22.0.2) first gets the step's own pip pin from its own
    pip, and the recorded install then installs that pin again (--ignore-installed), so the record still
    names it: the same record as where the venv's pip could report from the start."""
    version = metadata.version("pip")
    if tuple(int(part) for part in re.findall(r"\d+", version)[:2]) >= (22, 2):
        return []
    pins = [argument for argument in arguments if re.fullmatch(r"pip==[0-9][0-9A-Za-z.+!-]*", argument)]
    if not pins:
        raise StepError(f"pip {version} here has no --report (pip 22.2 added it), and this step pins no pip to install")
    run([sys.executable, "-m", "pip", "install", *pins], env=env)
    return ["--ignore-installed"]


def _compile_slice(paths: list[str]) -> None:
    with tempfile.NamedTemporaryFile("w", suffix=".txt") as listing:
        listing.write("\n".join(paths) + "\n")
        listing.flush()
        # failures ignored, as pip does: a package may ship files that are not valid Python
        subprocess.run([sys.executable, "-m", "compileall", "-qq", "-i", listing.name], check=False)


def compile_bytecode(names: list[str], epoch: int) -> None:
    """Bytecode for the distributions NAMES. With SOURCE_DATE_EPOCH (offline builds) the .pyc are hash-checked
    and uv's uv_cache.json in each dist-info is dated EPOCH, not the install time, so two builds match."""
    distributions = [metadata.distribution(name) for name in names]
    files = sorted(str(path.locate()) for dist in distributions for path in dist.files or [] if path.suffix == ".py")
    # marshal's output depends on what the compiling process did before (its reference flags follow
    # refcounts), so a worker pool would give other .pyc bytes per run: fixed slices of the sorted list,
    # each compiled by a fresh interpreter, give the same bytes on any machine
    with ThreadPoolExecutor(max_workers=os.cpu_count() or 1) as pool:
        list(pool.map(_compile_slice, [files[i::8] for i in range(8)]))
    for dist in distributions if epoch else []:  # online, the install time is true and builds differ anyway
        redate_uv_marker(Path(dist._path), epoch)  # type: ignore[attr-defined]  # its dist-info folder


def redate_uv_marker(info: Path, epoch: int) -> None:
    """uv's uv_cache.json in dist-info INFO dated EPOCH, and its line in RECORD following its new hash."""
    marker = info / "uv_cache.json"
    if not marker.is_file():
        return
    data = json.loads(marker.read_text())
    data["timestamp"] = {"secs_since_epoch": epoch, "nanos_since_epoch": 0}
    text = json.dumps(data, separators=(",", ":")).encode()
    marker.write_bytes(text)
    digest = base64.urlsafe_b64encode(hashlib.sha256(text).digest()).rstrip(b"=").decode()
    entry = f"{info.name}/uv_cache.json"
    record = info / "RECORD"
    lines = [
        f"{entry},sha256={digest},{len(text)}" if line.startswith(entry + ",") else line
        for line in record.read_text().splitlines()
    ]
    record.write_text("\n".join(lines) + "\n")


# ---- apt's sources --------------------------------------------------------------------------------------


def bare_url(url: str) -> tuple[str, tuple[str, str, str] | None]:
    """URL without its credentials (urls.py's one rule), and (machine, login, password) for apt's auth.conf."""
    # apt puts its own paths after the URL: a query or fragment would stand before them
    if not re.fullmatch(r"(https?|file)://[^\s?#]+", url):
        raise StepError("the build's apt mirror is not an http(s):// or file:// URL without spaces, '?' or '#'")
    try:
        bare, userinfo = urls.split_userinfo(url)
    except ValueError as error:
        raise StepError(f"the build's apt mirror: {error}") from None
    if userinfo is None:
        return url, None
    login, password = urls.login(userinfo)
    if not password or re.search(r"\s", login + password):
        raise StepError("the build's apt mirror has a login apt cannot take: give it as USER:PASSWORD, no spaces")
    # with its scheme: an entry without one would apply to https only
    return bare, (bare.rstrip("/"), login, password)


def mirrored(text: str, mirror: str, deb822: bool) -> str:
    """An apt sources file with every archive URI replaced by MIRROR; suites, components and options kept."""
    lines = []
    for line in text.splitlines():
        if deb822 and re.match(r"URIs:\s", line):
            line = f"URIs: {mirror}"
        elif not deb822 and (match := re.match(r"(deb(?:-src)?\s+(?:\[[^\]]*\]\s+)?)\S+(.*)", line)):
            line = match.group(1) + mirror + match.group(2)
        lines.append(line)
    return "\n".join(lines) + "\n"


def first_archive(etc: Path = Path("/etc/apt")) -> str | None:
    """The first archive URI of the base's distribution sources (deb822 files, then sources.list; another
    repository's .list in sources.list.d is not the distribution's archive)."""
    for path in sorted((etc / "sources.list.d").glob("*.sources")):
        if match := re.search(r"^URIs:\s*(\S+)", path.read_text(), re.MULTILINE):
            return match.group(1)
    main_list = etc / "sources.list"
    if main_list.is_file() and (match := re.search(r"^deb\s+(?:\[[^\]]*\]\s+)?(\S+)", main_list.read_text(), re.M)):
        return match.group(1)
    return None


def distribution(os_release: Path = Path("/etc/os-release")) -> str:
    """The base's distribution ID (debian, ubuntu, ...), as /etc/os-release gives it."""
    text = os_release.read_text() if os_release.is_file() else ""
    match = re.search(r"^ID=\"?([^\"\n]*)\"?$", text, re.MULTILINE)
    return match.group(1) if match else "unknown"


def refuse_foreign_mirror(secrets: Secrets, os_release: Path) -> None:
    """The build's apt mirror is a Debian archive: another distribution's apt would read its own paths there."""
    if secrets.apt_mirror and (found := distribution(os_release)) != "debian":
        raise StepError(
            f"the build's apt mirror is a Debian archive, and this base is {found}: build without --apt-mirror"
        )


@contextmanager
def apt_options(
    secrets: Secrets,
    *,
    sources: str | None = None,
    offline_list: Path | None = None,
    etc: Path = Path("/etc/apt"),
    os_release: Path = Path("/etc/os-release"),
) -> Iterator[list[str]]:
    """apt-get options for one step; the base's own files are never changed. SOURCES replaces the base's
    sources; else the build's mirror replaces each archive URI in copies of them; OFFLINE_LIST (the
    bundle's repository) replaces both. A mirror's userinfo goes into an auth.conf of the step's own."""
    options = ["-o", "Acquire::Languages=none"]
    if secrets.ca_bundle:
        options += ["-o", f"Acquire::https::CAInfo={secrets.ca_bundle}"]
    if offline_list is None:
        refuse_foreign_mirror(secrets, os_release)
    with tempfile.TemporaryDirectory(prefix="verlbox-apt-") as scratch:
        folder = Path(scratch)
        parts = folder / "sources.list.d"
        parts.mkdir()
        source_list = folder / "sources.list"
        if offline_list is not None:
            # the lock pins the versions: an index past its Valid-Until still vouches for the hashes it lists
            options += ["-o", "Acquire::Check-Valid-Until=false"]
            source_list = offline_list
        elif sources is not None:
            mirror, login = bare_url(secrets.apt_mirror) if secrets.apt_mirror else ("", None)
            source_list.write_text(sources.replace("{mirror}", mirror))
            _write_auth(folder, login, options)
        elif secrets.apt_mirror:
            mirror, login = bare_url(secrets.apt_mirror)
            base_list = etc / "sources.list"
            source_list.write_text(mirrored(base_list.read_text(), mirror, False) if base_list.is_file() else "")
            # the distribution's archive: sources.list and deb822 files; another repository's .list (NVIDIA's
            # CUDA repository on an Ubuntu base) is not on a Debian mirror, and is kept as it is
            for path in sorted((etc / "sources.list.d").glob("*")):
                if path.suffix == ".sources":
                    (parts / path.name).write_text(mirrored(path.read_text(), mirror, True))
                elif path.suffix == ".list":
                    shutil.copyfile(path, parts / path.name)
            _write_auth(folder, login, options)
        else:
            yield options
            return
        options += ["-o", f"Dir::Etc::SourceList={source_list}", "-o", f"Dir::Etc::SourceParts={parts}"]
        yield options


def _write_auth(folder: Path, login: tuple[str, str, str] | None, options: list[str]) -> None:
    if login is None:
        return
    auth = folder / "auth.conf"
    auth.touch(mode=0o600)
    auth.write_text(f"machine {login[0]} login {login[1]} password {login[2]}\n")
    options += ["-o", f"Dir::Etc::netrc={auth}"]


# ---- Debian packages ------------------------------------------------------------------------------------


def output_of(command: list[str]) -> str:
    """COMMAND's standard output (its errors go to the build log); a failure stops the step."""
    result = subprocess.run(command, stdout=subprocess.PIPE, text=True, check=False)
    if result.returncode != 0:
        raise StepError(f"{Path(command[0]).name} failed (exit {result.returncode})")
    return result.stdout


def dpkg_list() -> str:
    return output_of(["dpkg-query", "-W", "-f", "${Package}=${Version}\\n"])


def place_offline_debs(tools: Path, repository: Path) -> None:
    """The bundle's copy of the archive's signed indexes, and this step's .debs where its Packages files put
    them (the host computed pool.txt from those indexes): apt checks InRelease against the base's keyring,
    each Packages file against InRelease, each .deb against its Packages entry."""
    shutil.copytree(tools / "debian", repository, dirs_exist_ok=True)
    for line in (tools / "pool.txt").read_text().splitlines():
        deb, pool_path = line.split()
        target = repository / pool_path
        target.parent.mkdir(parents=True, exist_ok=True)
        shutil.copyfile(tools / "debs" / deb, target)


def locked_packages(step: str, given: list[str], tools: Path = TOOLS) -> list[str]:
    locked = tools / "lock" / f"{step}.apt.txt"
    return locked.read_text().split() if locked.is_file() else given


def install_debian(
    step: str, packages: list[str], apt_get_options: list[str], secrets: Secrets, *, offline: bool, tools: Path = TOOLS
) -> None:
    """apt-get install of the lock's name=version lines for STEP (else PACKAGES), recorded as the dpkg
    difference it made. Online from the base's sources (or the build's mirror); offline from the bundle."""
    before = BOOTSTRAP_BEFORE.read_text() if BOOTSTRAP_BEFORE.is_file() else dpkg_list()
    if BOOTSTRAP_BEFORE.is_file():
        # steps.sh installed the suite's python3 to run this module: the lock's versions may be older
        apt_get_options = [*apt_get_options, "--allow-downgrades"]
    repository = Path("/tmp/verlbox-repo")
    if offline:
        place_offline_debs(tools, repository)
    with apt_options(secrets, offline_list=tools / "offline.list" if offline else None) as options:
        run(["apt-get", *options, "update"])
        install = ["apt-get", *options, "install", "-y", "--no-install-recommends", *apt_get_options]
        run(install + locked_packages(step, packages, tools))
    build_record.write_record(step, "apt", build_record.apt_record(before, dpkg_list()))
    BOOTSTRAP_BEFORE.unlink(missing_ok=True)
    clear(Path("/var/lib/apt/lists"))
    if offline:
        shutil.rmtree(repository)
        forget_times()


def clear(folder: Path) -> None:
    for path in folder.iterdir() if folder.is_dir() else []:
        shutil.rmtree(path) if path.is_dir() and not path.is_symlink() else path.unlink()


def forget_times() -> None:
    """What apt and dpkg write with the time in it (binary caches, logs): it would differ between two builds."""
    for path in [*Path("/var/cache/apt").glob("*.bin"), Path("/var/cache/ldconfig/aux-cache")]:
        path.unlink(missing_ok=True)
    for log in Path("/var/log").rglob("*"):
        if log.is_file() and not log.is_symlink():
            log.write_bytes(b"")


def fetch_toolkit(suite: str, components: list[str], packages: list[str], secrets: Secrets, dest: Path) -> None:
    """.debs of SUITE (e.g. a compiler from a newer release) unpacked at DEST without dpkg's bookkeeping or
    apt's resolver: only this build stage uses them. The build's mirror, else the base's own archive."""
    archive = "{mirror}" if secrets.apt_mirror else first_archive()
    if archive is None:
        raise StepError("no Debian archive in the base image's apt sources: build with --apt-mirror")
    sources = f"deb [signed-by={DEBIAN_KEYRING}] {archive} {suite} {' '.join(components)}\n"
    with tempfile.TemporaryDirectory() as downloads, apt_options(secrets, sources=sources) as options:
        run(["apt-get", *options, "update"])
        run(["apt-get", *options, "download", *packages], cwd=Path(downloads))
        for deb in sorted(Path(downloads).glob("*.deb")):
            run(["dpkg", "-x", str(deb), str(dest)])
    clear(Path("/var/lib/apt/lists"))


# ---- `verlbox bundle` -----------------------------------------------------------------------------------


def bundle_wheels(dest: Path, secrets: Secrets, tools: Path = TOOLS, cache: Path = LOCKED_FILES) -> None:
    """Every step's Python files into DEST by name and sha256 (through the verified cache the locked steps
    fill): no installer runs, so no build backend an index serves can (pip download prepares an sdist's
    metadata by building it)."""
    dest.mkdir(parents=True, exist_ok=True)
    env = pip_environment(secrets, offline=False, index=None, extra_index="torch", base=dict(os.environ))
    entries = [
        entry for path in sorted((tools / "bundle" / "pip").glob("*.json")) for entry in json.loads(path.read_text())
    ]
    digests: dict[str, set[str]] = {}
    for entry in entries:
        digests.setdefault(entry["file"], set()).add(entry["sha256"])
    if twice := sorted(name for name, found in digests.items() if len(found) > 1):
        raise StepError(f"the lock names {', '.join(twice)} with two sha256s: one bundle folder cannot hold both")
    for path in fetch_locked(entries, cache, env):
        shutil.copyfile(path, dest / path.name)


def bundle_debs(dest: Path, indexes: Path, secrets: Secrets, tools: Path = TOOLS) -> None:
    """The image's locked .debs into DEST/STEP/, from the base's sources (or the build's mirror): apt checks
    them against the archive's signed indexes, which go into INDEXES for the offline build's apt."""
    dest.mkdir(parents=True, exist_ok=True)
    with apt_options(secrets) as options:
        run(["apt-get", *options, "update"])
        copy_indexes(Path("/var/lib/apt/lists"), indexes)
        fetch_compressed_indexes(indexes, options)
        for requirements in sorted((tools / "bundle" / "apt").glob("*.txt")):
            folder = dest / requirements.stem
            folder.mkdir(parents=True)
            run(["apt-get", *options, "download", *requirements.read_text().split()], cwd=folder)
    clear(Path("/var/lib/apt/lists"))


def copy_indexes(lists: Path, dest: Path) -> None:
    """The indexes apt fetched and checked (InRelease, or Release and its signature, and each Packages file),
    laid out as a repository's dists/ in DEST. Only Debian's archive layout, signed by Debian's keyring, is
    what an offline build's apt can check."""
    if not Path(DEBIAN_KEYRING).is_file() or not Path(DEBIAN_KEYRING).stat().st_size:
        raise StepError("the base has no Debian archive keyring: offline builds check .debs against Debian's only")
    for path in sorted(lists.glob("*_Packages")):
        if "_dists_" not in path.name:
            raise StepError(f"{path.name} is a flat repository's index: offline builds check Debian's archive only")
    for path in sorted(lists.glob("*_dists_*")):
        name = path.name.split("_dists_", 1)[1]
        if not name.endswith(("_InRelease", "_Release", "_Release.gpg", "_Packages")):
            continue
        target = dest / "dists" / name.replace("_", "/")
        target.parent.mkdir(parents=True, exist_ok=True)
        shutil.copyfile(path, target)
    if not list(dest.glob("dists/*/*/binary-*/Packages")):
        raise StepError("apt kept no uncompressed Packages index to bundle (Acquire::GzipIndexes set?)")


def release_sha256(release: str, name: str) -> str | None:
    """NAME's sha256 in a Release file's SHA256 section."""
    section = release.split("\nSHA256:\n", 1)[1] if "\nSHA256:\n" in release else ""
    for line in section.splitlines():
        if not line.startswith(" "):
            break
        fields = line.split()
        if len(fields) == 3 and fields[2] == name:
            return fields[0]
    return None


def fetch_compressed_indexes(dest: Path, options: list[str]) -> None:
    """Each Packages file as the archive serves it too, xz-compressed: an offline apt asks for that one first
    (InRelease lists it first), and a missing one is a hash mismatch. Fetched by apt's own helper, checked
    against the Release file's sha256."""
    targets = output_of(["apt-get", *options, "indextargets", "--format", "$(URI)", "Created-By: Packages"])
    for uri in targets.split():
        if "/dists/" not in uri:
            raise StepError(f"{uri} is not in an archive's dists/: offline builds check Debian's archive only")
        relative = uri.split("/dists/", 1)[1]
        suite, _, inside = relative.partition("/")
        release = next(iter(sorted((dest / "dists" / suite).glob("*Release"))), None)
        sha256 = release_sha256(release.read_text(), f"{inside}.xz") if release else None
        if sha256 is None:
            raise StepError(f"{inside}.xz is not in {suite}'s Release file")
        helper = [
            "/usr/lib/apt/apt-helper",
            *options,
            "download-file",
            f"{uri}.xz",
            str(dest / "dists" / f"{relative}.xz"),
        ]
        run([*helper, f"SHA256:{sha256}"])


# ---- command line ---------------------------------------------------------------------------------------


def parse(argv: list[str]) -> argparse.Namespace:
    parser = argparse.ArgumentParser(prog="build_steps.py", description=__doc__.split("\n\n")[0])
    parser.add_argument("--offline", action="store_true", help="from the bundle's files only")
    commands = parser.add_subparsers(dest="command", required=True)
    apt = commands.add_parser("apt")
    apt.add_argument("--apt-get-option", action="append", default=[])
    apt.add_argument("step")
    apt.add_argument("packages", nargs="*")
    pip = commands.add_parser("pip")
    pip.add_argument("--index", choices=["torch"])
    pip.add_argument("--extra-index", choices=["torch"])
    pip.add_argument("step")
    pip.add_argument("arguments", nargs=argparse.REMAINDER)
    toolkit = commands.add_parser("toolkit")
    toolkit.add_argument("suite")
    toolkit.add_argument("--component", action="append", required=True)
    toolkit.add_argument("packages", nargs="+")
    wheels = commands.add_parser("bundle-wheels")
    wheels.add_argument("dest", type=Path)
    debs = commands.add_parser("bundle-debs")
    debs.add_argument("dest", type=Path)
    debs.add_argument("indexes", type=Path)
    return parser.parse_args(argv)


def main(argv: list[str]) -> int:
    args = parse(argv)
    secrets = Secrets.read()
    try:
        if args.command == "apt":
            install_debian(args.step, args.packages, args.apt_get_option, secrets, offline=args.offline)
        elif args.command == "pip":
            env = pip_environment(
                secrets, offline=args.offline, index=args.index, extra_index=args.extra_index, base=dict(os.environ)
            )
            install_python(args.step, args.arguments, env, offline=args.offline)
        elif args.command == "toolkit":
            fetch_toolkit(args.suite, args.component, args.packages, secrets, Path("/"))
        elif args.command == "bundle-wheels":
            bundle_wheels(args.dest, secrets)
        else:
            bundle_debs(args.dest, args.indexes, secrets)
    except StepError as error:
        print(f"verlbox: {error}", file=sys.stderr)
        return 1
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
