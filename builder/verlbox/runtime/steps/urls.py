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
from collections.abc import Iterable
from urllib.parse import unquote, urlsplit, urlunsplit

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


def page_url(index: str, name: str) -> str:
    """Project NAME's page on INDEX (PEP 503: `INDEX/NAME/`), the index's query kept after it: an index that takes
    its token in the query (`https://host/simple/?token=X`) is asked `https://host/simple/NAME/?token=X`."""
    parts = urlsplit(index)
    return urlunsplit(parts._replace(path=f"{parts.path.rstrip('/')}/{name}/"))


def shown_under(url: str, indexes: Iterable[str]) -> str:
    """URL as a message may show it: redact()'s, and where it is on the scheme, host and port of one of INDEXES
    whose URL has a path, that path as `***` up to its last part (a project's page, a file's name): a token may
    ride in an index's path (`https://host/TOKEN/simple/`), and in the links its pages give to files on its own
    host (`https://host/TOKEN/files/NAME`), and nothing tells it from a plain folder."""
    shown = redact(url)
    where = urlsplit(shown)
    for index in indexes:
        base = urlsplit(redact(index))
        if base.path.strip("/") and (where.scheme, where.netloc) == (base.scheme, base.netloc):
            below = where.path.strip("/")
            last = "" if below == base.path.strip("/") else below.rsplit("/", 1)[-1]
            tail = "/" if where.path.endswith("/") and last else ""
            return urlunsplit(where._replace(path=f"/***/{last}{tail}"))
    return shown
