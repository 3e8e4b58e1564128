"""A run folder's .env, read as docker compose reads it, so that verlbox and compose never disagree on a value.

compose's rules (its dotenv parser, checked line by line against `docker compose config` in
tests/test_dotenv.py): a byte-order mark, blank lines and `#` comments skipped; `KEY=VALUE` or `KEY: VALUE`,
an optional `export`, spaces around the key dropped; a bare `KEY` takes the environment's value. An unquoted
value ends at ` #` (a space, then #) and loses its trailing space. A single-quoted value is taken as written
(only \\' is an escape) and may span lines; a double-quoted one may span lines and knows \\a \\b \\f \\n \\r \\t \\v
\\\\ \\" and \\$ (a dollar never expanded). After a closing quote the line goes on (`A="x" B=y` sets both).
Unquoted and double-quoted values expand $NAME, ${NAME}, ${NAME:-default}, ${NAME-default}, ${NAME:+alt},
${NAME+alt} (defaults expanded in turn) and $$ (a dollar), from the environment first, then from the lines
above; an unclosed ${ is refused, as compose refuses it.

python-dotenv 1.x, the usual choice, reads 13 of the 38 tested lines otherwise (it expands inside single
quotes, leaves $NAME, ${NAME:+alt} and nested defaults alone, cuts a comment after a tab, refuses YAML's colon
and two settings on a line), so verlbox keeps this reader of its own.
Shared: `init` and `shell` read it on the host, and so does `fetch` (which also runs in the image).
"""

from __future__ import annotations

import os
import re
from collections.abc import Mapping
from pathlib import Path

from verlbox.errors import UsageError

_KEY = re.compile(r"[A-Za-z_][A-Za-z0-9_.-]*")
_EXPORT = re.compile(r"export[ \t]+")
_NAME = re.compile(r"[A-Za-z_][A-Za-z0-9_]*")
_OPERATOR = re.compile(r":?[-+?]")
_ESCAPES = {"a": "\a", "b": "\b", "f": "\f", "n": "\n", "r": "\r", "t": "\t", "v": "\v", "\\": "\\", '"': '"'}
_LITERAL_DOLLAR = "\0"  # \$ in a double-quoted value: a dollar that expansion must pass over


class DotenvError(UsageError):
    pass


class _Reader:
    """One pass over a .env's text: a cursor, the line it is on, the values so far."""

    def __init__(self, text: str, source: str, environ: Mapping[str, str]) -> None:
        self.text = text.removeprefix("\ufeff")
        self.source = source
        self.environ = environ
        self.at = 0
        self.values: dict[str, str] = {}

    @property
    def where(self) -> str:
        return f"{self.source} line {self.text.count(chr(10), 0, self.at) + 1}"

    def fail(self, why: str) -> DotenvError:
        return DotenvError(f"{self.where}: {why}")

    def read(self) -> dict[str, str]:
        while self.at < len(self.text):
            char = self.text[self.at]
            if char in " \t\r\n":
                self.at += 1
            elif char == "#":
                self._to_line_end()
            else:
                self._assignment()
        return self.values

    def _line_end(self) -> int:
        end = self.text.find("\n", self.at)
        return len(self.text) if end == -1 else end

    def _to_line_end(self) -> int:
        self.at = self._line_end()
        return self.at

    def _skip_blanks(self) -> None:
        while self.at < len(self.text) and self.text[self.at] in " \t":
            self.at += 1

    def _assignment(self) -> None:
        start = self.at
        if (match := _EXPORT.match(self.text, self.at)) and _KEY.match(self.text, match.end()):
            self.at = match.end()
        key = _KEY.match(self.text, self.at)
        if key is None:
            raise self.fail(f"expected KEY=VALUE, found {self.text[start : self._line_end()][:40]!r}")
        self.at = key.end()
        self._skip_blanks()
        following = self.text[self.at] if self.at < len(self.text) else "\n"
        if following in "\n#":  # a bare KEY: the environment's value, as compose passes it on
            if key[0] in self.environ:
                self.values[key[0]] = self.environ[key[0]]
            return
        if following not in "=:":
            raise self.fail(f"expected KEY=VALUE, found {self.text[start : self._line_end()][:40]!r}")
        self.at += 1
        self._skip_blanks()
        self.values[key[0]] = self._value()

    def _value(self) -> str:
        quote = self.text[self.at] if self.at < len(self.text) else ""
        if quote == "'":
            return self._quoted("'", {"'": "'"}).replace(_LITERAL_DOLLAR, "$")
        if quote == '"':
            return self._expand(self._quoted('"', _ESCAPES | {"$": _LITERAL_DOLLAR}))
        start, end = self.at, self._to_line_end()
        return self._expand(self.text[start:end].split(" #", 1)[0].rstrip())

    def _quoted(self, quote: str, escapes: Mapping[str, str]) -> str:
        """The value between QUOTE and its closing match, escapes read; the cursor after the closing quote."""
        opened = self.at
        out, self.at = [], self.at + 1
        while self.at < len(self.text):
            char = self.text[self.at]
            if char == "\\" and self.at + 1 < len(self.text):
                following = self.text[self.at + 1]
                out.append(escapes.get(following, "\\" + following))
                self.at += 2
            elif char == quote:
                self.at += 1
                return "".join(out)
            else:
                out.append(char)
                self.at += 1
        kind = "single" if quote == "'" else "double"
        self.at = opened  # the line the value began on
        raise self.fail(f"a {kind}-quoted value that never ends (a closing {quote} is missing)")

    def _expand(self, value: str) -> str:
        return self._expanded(value).replace(_LITERAL_DOLLAR, "$")

    def _lookup(self, name: str) -> str | None:
        return self.environ[name] if name in self.environ else self.values.get(name)

    def _expanded(self, value: str) -> str:
        out, index = [], 0
        while index < len(value):
            char = value[index]
            if char != "$" or index + 1 == len(value):
                out.append(char)
                index += 1
            elif value[index + 1] == "$":
                out.append("$")
                index += 2
            elif value[index + 1] == "{":
                end = _closing_brace(value, index + 2)
                if end is None:
                    raise self.fail(f"an unclosed ${{ in {value[index:][:40]!r}")
                out.append(self._reference(value[index + 2 : end]))
                index = end + 1
            elif name := _NAME.match(value, index + 1):
                out.append(self._lookup(name[0]) or "")
                index = name.end()
            else:
                out.append(char)
                index += 1
        return "".join(out)

    def _reference(self, body: str) -> str:
        """${BODY}: NAME, then an operator and its word (expanded only when it is used)."""
        name = _NAME.match(body)
        if name is None:
            raise self.fail(f"${{{body}}} names no variable")
        operator = _OPERATOR.match(body, name.end())
        if operator is None:
            if name.end() != len(body):
                raise self.fail(f"${{{body}}}: expected ${{NAME}}, ${{NAME:-default}} or ${{NAME:+alternative}}")
            return self._lookup(name[0]) or ""
        current, word = self._lookup(name[0]), body[operator.end() :]
        unset = current is None or (current == "" and operator[0].startswith(":"))
        if operator[0].endswith("-"):
            return self._expanded(word) if unset else current or ""
        if operator[0].endswith("+"):
            return "" if unset else self._expanded(word)
        if unset:  # ? and :?, compose's "required"
            raise self.fail(f"${{{name[0]}}} is required: {self._expanded(word) or 'it is not set'}")
        return current or ""


def _closing_brace(value: str, start: int) -> int | None:
    """The index of the } that closes a ${ whose body starts at START, nested ${...} counted; None: unclosed."""
    depth, index = 1, start
    while index < len(value):
        if value.startswith("${", index):
            depth, index = depth + 1, index + 2
            continue
        if value[index] == "}":
            depth -= 1
            if depth == 0:
                return index
        index += 1
    return None


def dotenv_values_of(text: str, source: str = ".env", environ: Mapping[str, str] | None = None) -> dict[str, str]:
    """The values TEXT sets, read as compose reads them; SOURCE names the file in errors; ENVIRON (default: this
    process's) is where $NAME is looked up first."""
    return _Reader(text, source, os.environ if environ is None else environ).read()


def dotenv_values(path: Path, environ: Mapping[str, str] | None = None) -> dict[str, str]:
    """A .env's values; none where there is none or it cannot be read. A line compose would refuse is
    refused here too, naming the file and the line."""
    try:
        text = path.read_text(errors="replace")
    except OSError:
        return {}
    return dotenv_values_of(text, str(path), environ)
