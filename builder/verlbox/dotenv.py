"""A run folder's .env, read as docker compose reads it, so that verlbox and compose never disagree on a value.

compose's rules (its dotenv parser, checked line by line against `docker compose config` in
tests/test_dotenv.py): blank lines and `#` lines skipped, an optional `export `, spaces around the key
dropped; an unquoted value ends at ` #` (a space, then #) and loses its trailing space; a single-quoted
value is taken as written; a double-quoted one may span lines and knows \\n \\t \\r \\" \\\\; unquoted and
double-quoted values expand $NAME, ${NAME}, ${NAME:-default}, ${NAME-default}, ${NAME:+alt}, ${NAME+alt}
and $$ (a dollar), from the environment first, then from the lines above.

python-dotenv, the usual choice, reads three of the tested lines otherwise (it expands inside single quotes,
leaves $NAME alone, and cuts a comment after a tab), so verlbox keeps this reader of its own.
Shared: `init` and `shell` read it on the host, and so does `fetch` (which also runs in the image).
"""

from __future__ import annotations

import os
import re
from collections.abc import Mapping
from pathlib import Path

from verlbox.errors import UsageError

_KEY = re.compile(r"[A-Za-z_][A-Za-z0-9_.-]*")
_ESCAPES = {"n": "\n", "t": "\t", "r": "\r", '"': '"', "\\": "\\"}
_REFERENCE = re.compile(
    r"\$(?:(?P<dollar>\$)|(?P<bare>[A-Za-z_][A-Za-z0-9_]*)"
    r"|\{(?P<name>[A-Za-z_][A-Za-z0-9_]*)(?:(?P<op>:?[-+?])(?P<word>[^}]*))?\})"
)


class DotenvError(UsageError):
    pass


def _expand(value: str, known: Mapping[str, str], where: str) -> str:
    def replace(match: re.Match[str]) -> str:
        if match["dollar"]:
            return "$"
        name = match["bare"] or match["name"]
        current = known.get(name)
        op, word = match["op"], match["word"] or ""
        empty = current is None or (current == "" and op is not None and op.startswith(":"))
        if op is None:
            return current or ""
        if op.endswith("-"):
            return word if empty else current or ""
        if op.endswith("+"):
            return "" if empty else word
        if empty:  # ? and :?, compose's "required"
            raise DotenvError(f"{where}: ${{{name}}} is required: {word or 'it is not set'}")
        return current or ""

    return _REFERENCE.sub(replace, value)


def _double_quoted(text: str, start: int, where: str) -> tuple[str, int]:
    """The value of a double-quoted string opening at START, and where it ends (after its closing quote)."""
    out, index = [], start + 1
    while index < len(text):
        char = text[index]
        if char == "\\" and index + 1 < len(text):
            following = text[index + 1]
            out.append(_ESCAPES.get(following, "\\" + following))
            index += 2
            continue
        if char == '"':
            return "".join(out), index + 1
        out.append(char)
        index += 1
    raise DotenvError(f'{where}: a double-quoted value that never ends (a closing " is missing)')


def dotenv_values_of(text: str, source: str = ".env", environ: Mapping[str, str] | None = None) -> dict[str, str]:
    """The values TEXT sets, read as compose reads them; SOURCE names the file in errors; ENVIRON (default: this
    process's) is where $NAME is looked up first."""
    environ = os.environ if environ is None else environ
    values: dict[str, str] = {}
    index, line_number = 0, 1
    while index < len(text):
        end = text.find("\n", index)
        end = len(text) if end == -1 else end
        line, where = text[index:end], f"{source} line {line_number}"
        stripped = line.strip()
        if not stripped or stripped.startswith("#"):
            index, line_number = end + 1, line_number + 1
            continue
        body = stripped.removeprefix("export ").lstrip() if stripped.startswith("export ") else stripped
        key, equals, _ = body.partition("=")
        key = key.strip()
        if not equals or not _KEY.fullmatch(key):
            raise DotenvError(f"{where}: expected KEY=VALUE, found {stripped[:40]!r}")
        value_start = index + line.index("=") + 1
        while value_start < end and text[value_start] in " \t":
            value_start += 1
        known = {**values, **environ}
        quote = text[value_start] if value_start < end else ""
        if quote == "'":
            closing = text.find("'", value_start + 1, end)
            if closing == -1:
                raise DotenvError(f"{where}: a single-quoted value that never ends (a closing ' is missing)")
            values[key] = text[value_start + 1 : closing]
        elif quote == '"':
            raw, after = _double_quoted(text, value_start, where)
            values[key] = _expand(raw, known, where)
            line_number += text.count("\n", value_start, after)
            end = text.find("\n", after)
            end = len(text) if end == -1 else end
        else:
            raw = text[value_start:end].split(" #", 1)[0].rstrip()
            values[key] = _expand(raw, known, where)
        index, line_number = end + 1, line_number + 1
    return values


def dotenv_values(path: Path, environ: Mapping[str, str] | None = None) -> dict[str, str]:
    """A .env's values; none where there is none or it cannot be read. A line compose would refuse is
    refused here too, naming the file and the line."""
    try:
        text = path.read_text(errors="replace")
    except OSError:
        return {}
    return dotenv_values_of(text, str(path), environ)
