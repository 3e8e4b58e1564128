"""Stand-in servers on 127.0.0.1 for the upstreams verlbox reaches (tests never reach the real ones)."""

from __future__ import annotations

import socket
import threading
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
def serve_files(files: dict[str, bytes]) -> Iterator[str]:
    """A plain HTTP server for FILES (path -> bytes); yields its base URL. Other paths: 404."""

    class Handler(BaseHTTPRequestHandler):
        def do_GET(self) -> None:
            body = files.get(self.path)
            if body is None:
                self.send_error(404)
                return
            self.send_response(200)
            # a folder is an index page (pip reads only text/html ones)
            kind = "text/html" if self.path.endswith("/") else "application/octet-stream"
            self.send_header("Content-Type", kind)
            self.send_header("Content-Length", str(len(body)))
            self.end_headers()
            self.wfile.write(body)

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
