"""One rule for credentials in URLs (runtime/urls.py), and logins that stay with the host they were given for."""

from __future__ import annotations

import base64
import re
import threading
from collections.abc import Iterator
from contextlib import contextmanager
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer

import pytest

from verlbox.errors import UsageError
from verlbox.host.building.bootstrap import choose_mirror
from verlbox.host.building.sources import shown_url
from verlbox.host.clients.upstream import UpstreamError, host_of, opener, request_for
from verlbox.runtime.steps import build_steps
from verlbox.runtime.steps.urls import login, redact, split_userinfo
from verlbox.runtime.training import hub

# a base64 token's '/' written as %2F, as RFC 3986 has it: raw, it would end the host part (see below)
TOKEN_URL = "https://ci:AbC%2FdEf+9==@mirror.invalid:8443/debian?key=v#frag"
ADVICE = "percent-encode '/' in a password as %2F"


def test_a_raw_slash_in_a_password_is_refused_with_advice_and_the_encoded_one_is_the_password() -> None:
    """Before, the credentials ran to the last '@' before the query, so `AbC/dEf+9==` was taken whole for the
    password; but RFC 3986 (and urllib, which pip uses) ends the host part at that '/', the rest a path."""
    raw = TOKEN_URL.replace("%2F", "/")
    for url in (raw, "https://ci:/dEf+9==@mirror.invalid/debian", "https://ci:AbC%2FdEf+9==@/debian"):
        with pytest.raises(ValueError, match=re.escape(ADVICE)) as refused:
            split_userinfo(url)
        assert "AbC" not in str(refused.value) and "dEf" not in str(refused.value)
        assert shown_url(url) == "(the value, not shown: it may hold a credential)"
        with pytest.raises(UpstreamError, match=re.escape(ADVICE)):
            request_for(url)
        assert host_of(url) == "?"
        with pytest.raises(UsageError) as named:
            choose_mirror(url.split("?")[0])
        message = str(named.value)
        assert message.startswith("--apt-mirror ") and ADVICE in message and "\n" not in message
        assert "AbC" not in message and "dEf" not in message
    assert split_userinfo(TOKEN_URL) == ("https://mirror.invalid:8443/debian?key=v#frag", "ci:AbC%2FdEf+9==")
    assert login("ci:AbC%2FdEf+9==") == ("ci", "AbC/dEf+9==")
    assert redact(TOKEN_URL) == hub.redact(TOKEN_URL) == "https://mirror.invalid:8443/debian"
    assert shown_url(TOKEN_URL) == "https://mirror.invalid:8443/***/"  # an option's path may be a token
    assert build_steps.bare_url(TOKEN_URL.split("?")[0]) == (
        "https://mirror.invalid:8443/debian",
        ("https://mirror.invalid:8443/debian", "ci", "AbC/dEf+9=="),
    )
    with recording_server() as (mirror, seen):  # the upstream client's Basic login: the decoded password
        request = request_for(mirror.replace("http://", "http://ci:AbC%2FdEf+9==@") + "/file")
        with opener().open(request, timeout=10) as answer:
            assert answer.read() == b"ok"
    assert seen == ["Basic " + base64.b64encode(b"ci:AbC/dEf+9==").decode()]


@pytest.mark.parametrize(
    ("url", "bare"),
    [
        ("https://mirror.invalid/simple", "https://mirror.invalid/simple"),
        ("https://u@mirror.invalid/simple", "https://mirror.invalid/simple"),
        ("https://u:p%40ss@mirror.invalid/simple?token=a@b", "https://mirror.invalid/simple?token=a@b"),
        ("https://u:p@[::1]:8443/simple", "https://[::1]:8443/simple"),
        # an '@' past the host part is the path's: a scope, or a second host named there
        ("https://registry.invalid/@scope/pkg", "https://registry.invalid/@scope/pkg"),
        ("http://ci:T@a.invalid/repo/@b.invalid/simple/", "http://a.invalid/repo/@b.invalid/simple/"),
        ("file:///srv/mirror/@x", "file:///srv/mirror/@x"),
        ("not a url @ all", "not a url @ all"),
    ],
)
def test_the_credentials_end_at_the_last_at_inside_the_host_part(url: str, bare: str) -> None:
    assert split_userinfo(url)[0] == bare


def test_a_login_goes_to_the_host_it_was_written_for_not_one_named_in_the_path() -> None:
    """`http://ci:T@A/repo/@B/simple/` is user ci, password T, host A: before, login `ci:T@A/repo/` went to B."""
    url = "http://ci:T@a.invalid/repo/@b.invalid/simple/"
    assert split_userinfo(url) == ("http://a.invalid/repo/@b.invalid/simple/", "ci:T")
    assert build_steps.bare_url(url) == (
        "http://a.invalid/repo/@b.invalid/simple/",
        ("http://a.invalid/repo/@b.invalid/simple", "ci", "T"),
    )
    with recording_server() as (second, seen_second), recording_server() as (first, seen_first):
        named = f"{first.replace('http://', 'http://ci:T@')}/repo/@{second.removeprefix('http://')}/file"
        with opener().open(request_for(named), timeout=10) as answer:
            assert answer.read() == b"ok"
    assert seen_first == ["Basic " + base64.b64encode(b"ci:T").decode()] and seen_second == []


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
