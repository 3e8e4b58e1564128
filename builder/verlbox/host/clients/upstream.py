"""Asking upstreams over HTTP: one client with the build's CA and a time limit, whose every failure is one
line (no traceback, no credential), and the registry's anonymous token exchange Docker Hub uses.

`verlbox build RECIPE --check` (pins.py) and the source archives' download (archives.py) ask through this;
nothing here knows what a recipe is.
"""

from __future__ import annotations

import base64
import http.client
import json
import re
import ssl
import urllib.error
import urllib.request
from dataclasses import dataclass
from email.message import Message
from pathlib import Path
from urllib.parse import urlencode, urlsplit

from verlbox.host.clients.reference import full_name, parse_reference
from verlbox.runtime.steps.urls import login, redact, split_userinfo

# Docker Hub's registry API (docker.io names: reference.full_name spells a short name out in full)
DOCKER_HUB_REGISTRY = "registry-1.docker.io"
MANIFEST_TYPES = ", ".join(
    (
        "application/vnd.oci.image.index.v1+json",
        "application/vnd.docker.distribution.manifest.list.v2+json",
        "application/vnd.oci.image.manifest.v1+json",
        "application/vnd.docker.distribution.manifest.v2+json",
    )
)


class UpstreamError(Exception):
    """What a host answered, or failed to, in one line: never a URL's credentials or a token."""


@dataclass(frozen=True)
class Answer:
    status: int
    headers: Message
    body: bytes


def host_of(url: str) -> str:
    """The host[:port] of URL, without a login: what a line may name."""
    try:
        parts = urlsplit(split_userinfo(url)[0])
    except ValueError:  # urls.py refuses it: its host part may hold a piece of the password
        return "?"
    try:
        port = parts.port
    except ValueError:  # out of range (urls.py checks only that it is digits): the line still names the host
        port = None
    return f"{parts.hostname}:{port}" if port else parts.hostname or "?"


class SafeRedirect(urllib.request.HTTPRedirectHandler):
    """A redirected HEAD stays a HEAD (urllib turns it into a GET, which would fetch a whole wheel), and a
    login goes no further than the scheme, host and port it was given for (urllib copies it everywhere)."""

    def redirect_request(self, req, fp, code, msg, headers, newurl):  # type: ignore[no-untyped-def]
        new = super().redirect_request(req, fp, code, msg, headers, newurl)
        if new is None:
            return None
        new.method = req.get_method()
        if _origin(new.full_url) != _origin(req.full_url):
            new.headers.pop("Authorization", None)
            new.unredirected_hdrs.pop("Authorization", None)
        return new


def _origin(url: str) -> tuple[str, str | None, int | None]:
    parts = urlsplit(url)
    return parts.scheme, parts.hostname, parts.port or {"http": 80, "https": 443}.get(parts.scheme)


def opener(ca_bundle: Path | None = None) -> urllib.request.OpenerDirector:
    """urllib with the build's CA bundle and SafeRedirect."""
    context = ssl.create_default_context(cafile=str(ca_bundle) if ca_bundle else None)
    return urllib.request.build_opener(SafeRedirect(), urllib.request.HTTPSHandler(context=context))


def request_for(url: str, method: str = "GET", headers: dict[str, str] | None = None) -> urllib.request.Request:
    """A request for URL; its credentials (urls.py's rule) go as Basic auth, which urllib would ignore."""
    try:
        bare, userinfo = split_userinfo(url)
    except ValueError as error:  # its message names no part of the URL
        raise UpstreamError(str(error)) from None
    if not re.match(r"https?://[^/\s]", bare):  # nothing of urllib's file:, ftp: or data: handlers
        raise UpstreamError(f"not an http(s) URL: {redact(url)!r}")
    headers = {"User-Agent": "verlbox", **(headers or {})}
    if userinfo is not None:
        token = base64.b64encode(":".join(login(userinfo)).encode()).decode()
        headers["Authorization"] = f"Basic {token}"
    return urllib.request.Request(bare, method=method, headers=headers)


class Http:
    """HTTP(S) with the build's CA bundle and TIMEOUT seconds for each answer."""

    def __init__(self, ca_bundle: Path | None, timeout: float) -> None:
        self.timeout = timeout
        self._opener = opener(ca_bundle)

    def request(
        self, url: str, *, method: str = "GET", headers: dict[str, str] | None = None, body: bool = True
    ) -> Answer:
        """The answer, whatever its status; UpstreamError when there is none (refused, timed out, cut short).
        BODY False: its status and headers only (a server may ignore a Range and send a whole wheel)."""
        request = request_for(url, method, headers)
        try:
            with self._opener.open(request, timeout=self.timeout) as response:
                return Answer(response.status, response.headers, response.read() if body and method != "HEAD" else b"")
        except urllib.error.HTTPError as error:
            with error:
                return Answer(error.code, error.headers, b"")
        except http.client.IncompleteRead as error:
            raise UpstreamError(
                f"the answer was cut short ({len(error.partial)} bytes, then the connection closed)"
            ) from None
        except TimeoutError:
            raise UpstreamError(f"no answer within {self.timeout:g} s") from None
        except urllib.error.URLError as error:
            if isinstance(error.reason, TimeoutError):
                raise UpstreamError(f"no answer within {self.timeout:g} s") from None
            raise UpstreamError(f"cannot connect ({_reason(error.reason)})") from None
        except (http.client.HTTPException, ConnectionError, ssl.SSLError) as error:
            raise UpstreamError(f"no valid HTTP answer ({type(error).__name__})") from None
        except ValueError as error:  # a URL urllib cannot take (a bad port, an empty host)
            raise UpstreamError(f"not a URL that can be asked ({error})") from None


def _reason(reason: object) -> str:
    text = getattr(reason, "strerror", None) or str(reason)
    return re.sub(r"^\[Errno -?\d+\]\s*", "", text)


def status_line(answer: Answer) -> str:
    return f"HTTP {answer.status} {http.client.responses.get(answer.status, '')}".strip()


# ---- a registry's manifests (registry API v2) --------------------------------------------------------------


def registry_manifest_url(image: str, digest: str | None) -> str:
    """Where a registry serves IMAGE's manifest (by DIGEST when given). A registry on this machine
    (localhost, 127.0.0.1) is asked over plain HTTP, as Docker does; any other over HTTPS."""
    reference = parse_reference(image)
    registry, _, path = parse_reference(full_name(image)).repository.partition("/")
    registry = DOCKER_HUB_REGISTRY if registry == "docker.io" else registry  # Docker Hub's API host
    scheme = "http" if registry.split(":")[0] in ("localhost", "127.0.0.1") else "https"
    return f"{scheme}://{registry}/v2/{path}/manifests/{digest or reference.tag}"


def _bearer_challenge(header: str) -> dict[str, str] | None:
    if not header.lower().startswith("bearer "):
        return None
    return dict(re.findall(r'(\w+)="([^"]*)"', header))


def registry_manifest(http: Http, url: str) -> Answer:
    """HEAD of a manifest, with the anonymous pull token a registry's 401 asks for (Docker Hub's realm)."""
    headers = {"Accept": MANIFEST_TYPES}
    answer = http.request(url, method="HEAD", headers=headers)
    challenge = _bearer_challenge(answer.headers.get("WWW-Authenticate", "")) if answer.status == 401 else None
    if challenge is None or "realm" not in challenge:
        return answer
    query = urlencode({key: challenge[key] for key in ("service", "scope") if key in challenge})
    issued = http.request(f"{challenge['realm']}?{query}" if query else challenge["realm"])
    if issued.status != 200:
        raise UpstreamError(f"its token service ({host_of(challenge['realm'])}) answered {status_line(issued)}")
    try:
        grant = json.loads(issued.body)
        token = grant.get("token") or grant.get("access_token")
    except (ValueError, AttributeError):
        token = None
    if not isinstance(token, str) or not token:
        raise UpstreamError(f"its token service ({host_of(challenge['realm'])}) gave no token")
    return http.request(url, method="HEAD", headers=headers | {"Authorization": f"Bearer {token}"})
