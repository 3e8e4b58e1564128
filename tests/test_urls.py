"""One rule for credentials in URLs (runtime/urls.py), and logins that stay with the host they were given for."""

from __future__ import annotations

import threading
from collections.abc import Iterator
from contextlib import contextmanager
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer

import pytest

from verlbox.host.building.sources import shown_url
from verlbox.host.clients.upstream import opener, request_for
from verlbox.runtime.steps import build_steps
from verlbox.runtime.steps.urls import redact, split_userinfo
from verlbox.runtime.training import hub

TOKEN_URL = "https://ci:AbC/dEf+9==@mirror.invalid:8443/debian?key=v#frag"


def test_a_password_with_a_slash_is_still_the_password_everywhere() -> None:
    """Before, the authority ended at the first '/': `AbC` was taken for the host and the rest was shown."""
    assert split_userinfo(TOKEN_URL) == ("https://mirror.invalid:8443/debian?key=v#frag", "ci:AbC/dEf+9==")
    assert redact(TOKEN_URL) == hub.redact(TOKEN_URL) == "https://mirror.invalid:8443/debian"
    assert shown_url(TOKEN_URL) == "https://mirror.invalid:8443/debian"
    mirror = TOKEN_URL.split("?")[0]
    assert build_steps.bare_url(mirror) == (
        "https://mirror.invalid:8443/debian",
        ("https://mirror.invalid:8443/debian", "ci", "AbC/dEf+9=="),
    )


@pytest.mark.parametrize(
    ("url", "bare"),
    [
        ("https://mirror.invalid/simple", "https://mirror.invalid/simple"),
        ("https://u@mirror.invalid/simple", "https://mirror.invalid/simple"),
        ("https://u:p%40ss@mirror.invalid/simple?token=a@b", "https://mirror.invalid/simple?token=a@b"),
        ("not a url @ all", "not a url @ all"),
    ],
)
def test_the_credentials_end_at_the_last_at_before_the_query(url: str, bare: str) -> None:
    assert split_userinfo(url)[0] == bare


@contextmanager
def recording_server(redirect_to: str | None = None) -> Iterator[tuple[str, list[str | None]]]:
    """A server that records each request's Authorization header; with REDIRECT_TO, a 302 there."""
    seen: list[str | None] = []

    class Handler(BaseHTTPRequestHandler):
        def do_GET(self) -> None:
            seen.append(self.headers.get("Authorization"))
            if redirect_to and self.path == "/file":
                self.send_response(302)
                self.send_header("Location", redirect_to)
                self.send_header("Content-Length", "0")
                self.end_headers()
                return
            self.send_response(200)
            self.send_header("Content-Length", "2")
            self.end_headers()
            self.wfile.write(b"ok")

        def log_message(self, format: str, *args: object) -> None:
            pass

    server = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
    threading.Thread(target=server.serve_forever, daemon=True).start()
    try:
        yield f"http://127.0.0.1:{server.server_address[1]}", seen
    finally:
        server.shutdown()
        server.server_close()


def test_a_login_is_not_carried_by_a_redirect_to_another_port_but_is_on_the_same_one() -> None:
    with recording_server() as (elsewhere, seen_elsewhere):
        with recording_server(redirect_to=f"{elsewhere}/moved") as (mirror, seen_mirror):
            url = mirror.replace("http://", "http://ci:s3cr3t@") + "/file"
            with opener().open(request_for(url), timeout=10) as answer:
                assert answer.read() == b"ok"
        assert seen_mirror == ["Basic Y2k6czNjcjN0"] and seen_elsewhere == [None]
    with recording_server(redirect_to="/moved") as (mirror, seen):  # the same scheme, host and port
        url = mirror.replace("http://", "http://ci:s3cr3t@") + "/file"
        with opener().open(request_for(url), timeout=10) as answer:
            assert answer.read() == b"ok"
        assert seen == ["Basic Y2k6czNjcjN0", "Basic Y2k6czNjcjN0"]
