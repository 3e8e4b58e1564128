"""Stand-in servers on 127.0.0.1 for the upstreams verlbox reaches (tests never reach the real ones)."""

from __future__ import annotations

import json
import socket
import threading
import time
from base64 import b64encode
from collections.abc import Iterator
from contextlib import contextmanager
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer

SLOW_SECONDS = 5


def closed_port_url() -> str:
    """An http URL on 127.0.0.1 where nothing listens (the port was free a moment ago)."""
    with socket.socket() as probe:
        probe.bind(("127.0.0.1", 0))
        port = probe.getsockname()[1]
    return f"http://127.0.0.1:{port}"


@contextmanager
def serve_files(files: dict[str, bytes], *, basic_auth: str | None = None, fault: str | None = None) -> Iterator[str]:
    """A plain HTTP server for FILES (path -> bytes); yields its base URL. Other paths: 404.

    BASIC_AUTH ("user:password"): 401 without it. FAULT "truncated": the promised length, half the
    bytes; "garbage": no HTTP at all in answer; "slow": no answer for SLOW_SECONDS.
    """

    class Handler(BaseHTTPRequestHandler):
        def do_HEAD(self) -> None:
            self.do_GET(head=True)

        def do_GET(self, head: bool = False) -> None:
            if fault == "slow":
                time.sleep(SLOW_SECONDS)
            if fault == "garbage":
                self.wfile.write(b"this is not HTTP\r\n\r\n")
                return
            if basic_auth and self.headers.get("Authorization") != f"Basic {b64encode(basic_auth.encode()).decode()}":
                self.send_error(401)
                return
            body = files.get(self.path.partition("?")[0])  # a token in the query is not part of the name
            if body is None:
                self.send_error(404)
                return
            self.send_response(200)
            # a folder is an index page (pip reads only text/html ones)
            kind = "text/html" if self.path.endswith("/") else "application/octet-stream"
            self.send_header("Content-Type", kind)
            self.send_header("Content-Length", str(len(body)))
            self.end_headers()
            if not head:
                self.wfile.write(body[: len(body) // 2] if fault == "truncated" else body)

        def log_message(self, format: str, *args: object) -> None:  # quiet: pytest shows failures
            pass

    with _serving(Handler) as url:
        yield url


@contextmanager
def _serving(handler: type[BaseHTTPRequestHandler]) -> Iterator[str]:
    server = ThreadingHTTPServer(("127.0.0.1", 0), handler)
    server.daemon_threads = True  # a slow answer still pending does not hold the test's end
    thread = threading.Thread(target=server.serve_forever, daemon=True)
    thread.start()
    try:
        yield f"http://127.0.0.1:{server.server_address[1]}"
    finally:
        server.shutdown()
        server.server_close()


REGISTRY_TOKEN = "t0ken-never-shown"


@contextmanager
def serve_registry(manifests: dict[str, str], *, token_status: int = 200) -> Iterator[str]:
    """A registry API v2 as Docker Hub answers: a manifest HEAD without a token gets 401 and a Bearer
    challenge naming this server's token endpoint; with the token, 200 and the manifest's digest for each
    path in MANIFESTS ("/v2/NAME/manifests/TAG" -> digest), 404 for others. TOKEN_STATUS: the token
    endpoint's answer (anything but 200 refuses). Yields host:port, to put in an image reference."""

    class Handler(BaseHTTPRequestHandler):
        def do_GET(self) -> None:
            path = self.path.partition("?")[0]
            if path == "/token":
                body = json.dumps({"token": REGISTRY_TOKEN}).encode()
                self.send_response(token_status)
                self.send_header("Content-Length", str(len(body) if token_status == 200 else 0))
                self.end_headers()
                if token_status == 200:
                    self.wfile.write(body)
                return
            self.send_error(404)

        def do_HEAD(self) -> None:
            if self.headers.get("Authorization") != f"Bearer {REGISTRY_TOKEN}":
                self.send_response(401)
                realm = f"http://{self.headers['Host']}/token"
                challenge = f'Bearer realm="{realm}",service="standin",scope="repository:nvidia/cuda:pull"'
                self.send_header("WWW-Authenticate", challenge)
                self.send_header("Content-Length", "0")
                self.end_headers()
                return
            digest = manifests.get(self.path)
            self.send_response(200 if digest else 404)
            if digest:
                self.send_header("Docker-Content-Digest", digest)
            self.send_header("Content-Length", "0")
            self.end_headers()

        def log_message(self, format: str, *args: object) -> None:
            pass

    with _serving(Handler) as url:
        yield url.removeprefix("http://")


@contextmanager
def serve_manifests(objects: dict[str, tuple[str, bytes]], seen: list[str] | None = None) -> Iterator[str]:
    """A registry API v2 serving OBJECTS (digest -> (media type, bytes)) at /v2/NAME/manifests/DIGEST, HEAD and GET,
    with Content-Type and Docker-Content-Digest, as unkind as a real one: no Bearer token, a 401 with a challenge
    naming this server's token endpoint; a GET whose Accept does not list the object's media type, 404 (a
    registry serves no type the client did not ask for); any other path, 404. SEEN collects "METHOD PATH
    AUTHORIZATION" of each manifest request. Yields host:port, to put in an image reference."""

    class Handler(BaseHTTPRequestHandler):
        def do_HEAD(self) -> None:
            self.do_GET(head=True)

        def do_GET(self, head: bool = False) -> None:
            if self.path.partition("?")[0] == "/token":
                self._answer(200, "application/json", json.dumps({"token": REGISTRY_TOKEN}).encode(), head)
                return
            authorization = self.headers.get("Authorization") or "none"
            if seen is not None and "/manifests/" in self.path:
                seen.append(f"{self.command} {self.path} {authorization}")
            if authorization != f"Bearer {REGISTRY_TOKEN}":
                self.send_response(401)
                challenge = f'Bearer realm="http://{self.headers["Host"]}/token",service="standin"'
                self.send_header("WWW-Authenticate", challenge)
                self.send_header("Content-Length", "0")
                self.end_headers()
                return
            name, _, digest = self.path.partition("/manifests/")
            accepted = [kind.split(";")[0].strip() for kind in (self.headers.get("Accept") or "").split(",")]
            found = objects.get(digest) if name.startswith("/v2/") else None
            if found is None or (not head and found[0] not in accepted):
                self._answer(404, "application/json", b'{"errors":[{"code":"MANIFEST_UNKNOWN"}]}', head)
                return
            self._answer(200, found[0], found[1], head, {"Docker-Content-Digest": digest})

        def _answer(
            self, status: int, kind: str, body: bytes, head: bool, headers: dict[str, str] | None = None
        ) -> None:
            self.send_response(status)
            for key, value in {"Content-Type": kind, "Content-Length": str(len(body)), **(headers or {})}.items():
                self.send_header(key, value)
            self.end_headers()
            if not head:
                self.wfile.write(body)

        def log_message(self, format: str, *args: object) -> None:
            pass

    with _serving(Handler) as url:
        yield url.removeprefix("http://")
