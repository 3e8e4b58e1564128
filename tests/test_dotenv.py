"""verlbox's .env reader against docker compose itself: each line of a table of real-world .env lines read by
both, and the same values (or both refusing)."""

from __future__ import annotations

import json
import os
import subprocess
from pathlib import Path

import pytest

from verlbox.dotenv import DotenvError, dotenv_values, dotenv_values_of

# what people write: quotes with a comment after, comments, export, spaces, references to other lines and to
# the environment, defaults (nested too), escapes, values spanning lines, two settings on a line, YAML's colon
LINES = [
    "\ufeffFIRST=after a byte-order mark",
    'VERLBOX_MODEL_NAME="Qwen2.5-0.5B-Instruct" # the model',
    "PLAIN=plain # a comment",
    "HASH=abc#def",
    "SINGLE='single # not a comment' # a comment",
    'DOUBLE="a \\"quoted\\" word, a\\nnew line and a\\ttab"',
    'CONTROLS="bell\\a back\\b feed\\f vertical\\v unknown\\x41"',
    'ESCAPED_DOLLAR="pa\\$word and \\${PLAIN}"',
    "LITERAL='$PLAIN ${PLAIN} stay as written'",
    "SINGLE_ESCAPE='it\\'s'",
    "REFERENCES=ref ${PLAIN} and $PLAIN",
    'QUOTED_REFERENCE="dq ${PLAIN}/x"',
    "FALLBACK=${VERLBOX_UNSET_FOR_TEST:-fallback}",
    "NESTED=${VERLBOX_UNSET_FOR_TEST:-${PLAIN}-nested}",
    "DASH_DEFAULT=${VERLBOX_EMPTY_FOR_TEST-kept empty}",
    "COLON_DEFAULT=${VERLBOX_EMPTY_FOR_TEST:-empty is unset}",
    "ALTERNATE=${PLAIN:+set}",
    "export EXPORTED=exported",
    "export\tTABBED=after a tab",
    "SPACED = spaced",
    "PADDED=  lead and trail  ",
    "EMPTY=",
    'EMPTY_QUOTED="" # empty, quoted',
    "EQUALS=a=b=c",
    "TAB=tab\t# a tab is not a comment's start",
    "MANY=x # y # z",
    "FROM_ENVIRONMENT=$VERLBOX_FROM_ENVIRONMENT/sub",
    "INHERITED_FROM_ENVIRONMENT",
    "DOLLARS=$$literal",
    "LATER=${DEFINED_BELOW}",
    "DEFINED_BELOW=below",
    'MULTILINE="first\nsecond"',
    "SINGLE_MULTILINE='one\ntwo'",
    'ON_ONE_LINE="x" AND_ANOTHER=y',
    "YAML_STYLE: colon",
    "AFTER_ALL=still read",
    "  # an indented comment",
    "INDENTED_KEY=indented",
]
KEYS = [
    "FIRST", "VERLBOX_MODEL_NAME", "PLAIN", "HASH", "SINGLE", "DOUBLE", "CONTROLS", "ESCAPED_DOLLAR", "LITERAL",
    "SINGLE_ESCAPE", "REFERENCES", "QUOTED_REFERENCE", "FALLBACK", "NESTED", "DASH_DEFAULT", "COLON_DEFAULT",
    "ALTERNATE", "EXPORTED", "TABBED", "SPACED", "PADDED", "EMPTY", "EMPTY_QUOTED", "EQUALS", "TAB", "MANY",
    "FROM_ENVIRONMENT", "INHERITED_FROM_ENVIRONMENT", "DOLLARS", "LATER", "DEFINED_BELOW", "MULTILINE",
    "SINGLE_MULTILINE", "ON_ONE_LINE", "AND_ANOTHER", "YAML_STYLE", "AFTER_ALL", "INDENTED_KEY",
]  # fmt: skip
ENVIRONMENT = {
    "VERLBOX_FROM_ENVIRONMENT": "/from/env",
    "VERLBOX_EMPTY_FOR_TEST": "",
    "INHERITED_FROM_ENVIRONMENT": "inherited",
}


def composes_reading(folder: Path, lines: list[str], keys: list[str]) -> subprocess.CompletedProcess[str]:
    """`docker compose config` of a service whose environment names every key of LINES' .env."""
    (folder / ".env").write_text("\n".join(lines) + "\n")
    environment = "".join(f"      {key}: ${{{key}-<unset>}}\n" for key in keys)
    (folder / "compose.yaml").write_text(f"services:\n  s:\n    image: scratch\n    environment:\n{environment}")
    env = {"PATH": os.environ["PATH"], "HOME": os.environ.get("HOME", "/root"), **ENVIRONMENT}
    return subprocess.run(
        ["docker", "compose", "config", "--format", "json"], cwd=folder, env=env, capture_output=True, text=True
    )


def test_every_line_reads_as_compose_reads_it(tmp_path: Path, compose_cli: None) -> None:
    result = composes_reading(tmp_path, LINES, KEYS)
    assert result.returncode == 0, result.stderr
    # compose writes a dollar in its output as $$
    composes = {k: v.replace("$$", "$") for k, v in json.loads(result.stdout)["services"]["s"]["environment"].items()}
    ours = dotenv_values(tmp_path / ".env", ENVIRONMENT)
    assert set(ours) == set(composes), sorted(set(ours) ^ set(composes))
    differing = {key: (ours[key], composes[key]) for key in ours if ours[key] != composes[key]}
    assert not differing, differing
    # and what the table is for: the line, quotes and comment and all
    assert ours["VERLBOX_MODEL_NAME"] == "Qwen2.5-0.5B-Instruct"
    assert ours["LITERAL"] == "$PLAIN ${PLAIN} stay as written" and ours["DOLLARS"] == "$literal"
    assert ours["LATER"] == "" and ours["MULTILINE"] == "first\nsecond"
    assert ours["ESCAPED_DOLLAR"] == "pa$word and ${PLAIN}" and ours["NESTED"] == "plain-nested"
    assert ours["ON_ONE_LINE"] == "x" and ours["AND_ANOTHER"] == "y" and ours["YAML_STYLE"] == "colon"


@pytest.mark.parametrize(
    ("line", "said"),
    [
        ('OPEN="never closed', r"\.env line 2: a double-quoted value that never ends"),
        ("OPEN='never closed", r"\.env line 2: a single-quoted value that never ends"),
        ("NO_EQUALS_SIGN here", r"\.env line 2: expected KEY=VALUE, found 'NO_EQUALS_SIGN here'"),
        ("BAD KEY=1", r"\.env line 2: expected KEY=VALUE"),
        ("UNCLOSED=${FOO", r"\.env line 2: an unclosed \$\{"),
    ],
)
def test_a_line_compose_refuses_is_refused_naming_the_file_and_line(
    tmp_path: Path, compose_cli: None, line: str, said: str
) -> None:
    lines = ["FIRST=1", line]
    assert composes_reading(tmp_path, lines, ["FIRST"]).returncode != 0  # compose refuses it too
    with pytest.raises(DotenvError, match=rf"^{tmp_path / '.env'} line 2|{said}") as refused:
        dotenv_values(tmp_path / ".env", {})
    assert str(refused.value).startswith(f"{tmp_path / '.env'} line 2: ")


def test_the_environment_wins_over_the_lines_above_as_in_compose() -> None:
    values = dotenv_values_of("A=file\nB=${A}-b\n", environ={"A": "shell"})
    assert values == {"A": "file", "B": "shell-b"}
