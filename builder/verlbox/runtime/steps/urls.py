"""One rule for the credentials in a URL, for all of verlbox (host, image and build steps alike): they are
whatever stands between `scheme://` and the last `@` before the URL's query or fragment. A password that
holds a `/` (a base64 token) is still the password, never a path: it is never shown, never written into an
apt source, and goes only as a login to the host it was given for.

Standard library only: build steps run it before verlbox is installed (mounted beside build_steps.py).
"""

from __future__ import annotations

import re
from urllib.parse import unquote

_SCHEME = re.compile(r"([A-Za-z][A-Za-z0-9+.-]*://)(.*)", re.DOTALL)


def split_userinfo(url: str) -> tuple[str, str | None]:
    """(URL without its credentials, the credentials or None)."""
    match = _SCHEME.fullmatch(url)
    if not match:
        return url, None
    scheme, rest = match.groups()
    before_query = re.split(r"[?#]", rest, maxsplit=1)[0]
    at = before_query.rfind("@")
    if at < 0:
        return url, None
    return scheme + rest[at + 1 :], rest[:at]


def login(userinfo: str) -> tuple[str, str]:
    """(user, password) of credentials `user[:password]`, percent-decoded."""
    user, _, password = userinfo.partition(":")
    return unquote(user), unquote(password)


def redact(url: str) -> str:
    """URL as it may be shown or recorded: no credentials, and no query or fragment (a token may ride there)."""
    bare, _ = split_userinfo(url)
    return re.split(r"[?#]", bare, maxsplit=1)[0]
