"""One rule for the credentials in a URL, for all of verlbox (host, image and build steps alike), RFC 3986's:
the authority runs from `scheme://` to the first `/`, `?` or `#`, and the credentials are what stands in it
before its last `@`. An `@` further on belongs to the path or query (`/repo/@scope/`), so a login always
goes to the host written right after it, never to one named later in the path. A password with a raw `/`
cannot be told from a path and is refused (ValueError, the password never in its message): it is written
percent-encoded, `%2F`, and login() decodes it.

Standard library only, and Python 3.9: build steps run it before verlbox is installed (mounted beside
build_steps.py).
"""

from __future__ import annotations

import re
from urllib.parse import unquote

_SCHEME = re.compile(r"([A-Za-z][A-Za-z0-9+.-]*://)(.*)", re.DOTALL)
# what may follow the credentials: a bracketed IP literal or a name, then a port of digits. Anything else
# there (`u:ab` of `https://u:ab/cd@host/`, an empty host after a login) is a password's `/` or a typo.
_HOST_PORT = re.compile(r"(\[[^\[\]\s]*\]|[^\[\]:\s]*)(:[0-9]+)?")
_MALFORMED = (
    "the host[:port] after '://' is malformed (a raw '/' in a password ends it): "
    "percent-encode '/' in a password as %2F"
)


def split_userinfo(url: str) -> tuple[str, str | None]:
    """(URL without its credentials, the credentials or None); ValueError when its authority is no host[:port]."""
    match = _SCHEME.fullmatch(url)
    if not match:
        return url, None
    scheme, rest = match.groups()
    authority = re.split(r"[/?#]", rest, maxsplit=1)[0]
    userinfo, at, host = authority.rpartition("@")
    # a message naming any of the authority could show part of a password
    if not _HOST_PORT.fullmatch(host) or (at and not host):
        raise ValueError(_MALFORMED)
    if not at:
        return url, None
    return scheme + rest[len(userinfo) + 1 :], userinfo


def login(userinfo: str) -> tuple[str, str]:
    """(user, password) of credentials `user[:password]`, percent-decoded."""
    user, _, password = userinfo.partition(":")
    return unquote(user), unquote(password)


def redact(url: str) -> str:
    """URL as it may be shown or recorded: no credentials, and no query or fragment (a token may ride there)."""
    bare, _ = split_userinfo(url)
    return re.split(r"[?#]", bare, maxsplit=1)[0]
