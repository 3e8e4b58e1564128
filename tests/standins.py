"""Stand-in servers on 127.0.0.1 for the upstreams verlbox reaches (tests never reach the real ones)."""

from __future__ import annotations

import socket
import threading
from base64 import b64encode
from collections.abc import Iterator
from contextlib import contextmanager
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer


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
    bytes; "garbage": no HTTP at all in answer.
    """

    class Handler(BaseHTTPRequestHandler):
        def do_GET(self) -> None:
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
            self.wfile.write(body[: len(body) // 2] if fault == "truncated" else body)

        def log_message(self, format: str, *args: object) -> None:  # quiet: pytest shows failures
            pass

    server = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
    thread = threading.Thread(target=server.serve_forever, daemon=True)
    thread.start()
    try:
        yield f"http://127.0.0.1:{server.server_address[1]}"
    finally:
        server.shutdown()
        server.server_close()
