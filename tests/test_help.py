"""Every command's --help ends with real examples: each one a command line the real parser takes."""

from __future__ import annotations

import shlex

import pytest

from conftest import run_verlbox
from verlbox.cli import HANDLERS, _split_one_command, build_parser

# where a shell line's verlbox command ends
SHELL_OPERATORS = {">", ">>", "|", "&&", ";"}


def examples_of(help_text: str) -> list[str]:
    """The lines of the help's last section, `examples:`; [] when it has none or it is not last."""
    _, found, section = help_text.rpartition("\nexamples:\n")
    if not found:
        return []
    lines = section.rstrip("\n").splitlines()
    assert all(line.startswith("  verlbox ") for line in lines), f"not an example per line: {lines}"
    return [line.strip() for line in lines]


def verlbox_words(line: str) -> list[str]:
    """The words of LINE's first command after `verlbox`, its comment and any redirection or `&&` left out."""
    words = shlex.split(line, comments=True)
    cut = next((index for index, word in enumerate(words) if word in SHELL_OPERATORS), len(words))
    assert words[0] == "verlbox", line
    return words[1:cut]


def help_of(*command: str) -> str:
    result = run_verlbox(*command, "--help")
    assert result.returncode == 0, result.stderr
    return result.stdout


@pytest.mark.parametrize("command", ["", *HANDLERS], ids=lambda name: name or "verlbox")
def test_help_ends_with_examples_the_parser_takes(command: str) -> None:
    examples = examples_of(help_of(*([command] if command else [])))
    assert 1 <= len(examples) <= 3, examples
    parser = build_parser()
    for example in examples:
        words, one_command = _split_one_command(verlbox_words(example))
        try:
            parsed = parser.parse_args(words)
        except SystemExit as exit:  # the parser's own refusal: exit 2 with its message on stderr
            pytest.fail(f"{example!r} does not parse (exit {exit.code})")
        if command:
            assert parsed.command == command, example
        assert not one_command or command == "shell", example


def test_a_broken_example_would_be_caught() -> None:
    """The check above is not vacuous: an option the command lacks, or a missing argument, is refused."""
    parser = build_parser()
    for words in (["build", "p40", "--no-such-option"], ["bundle", "p40-cu124"], ["completion", "fish"]):
        with pytest.raises(SystemExit):
            parser.parse_args(words)


def test_examples_keep_their_layout_in_help() -> None:
    """RawDescriptionHelpFormatter: each example on its own line, comment aligned, never rewrapped."""
    text = help_of("clean")
    assert "\nexamples:\n  verlbox clean                           # a dry run: what would go, and its size\n" in text
