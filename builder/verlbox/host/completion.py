"""`verlbox completion bash|zsh`: a completion script generated from verlbox's own argument parser.

The script is static: every command, option and choice comes from `cli.build_parser()` and the recipe names
from the shipped recipes when it is printed, so it needs no Python at each Tab (verlbox's start is slow
next to a keystroke) and no package beyond verlbox. Image arguments ask the Docker CLI for the verlbox
images at Tab time. Print it again after upgrading verlbox.
"""

from __future__ import annotations

import argparse
import sys
from dataclasses import dataclass

from verlbox import __version__
from verlbox.host.recipes.recipe import recipe_names

# what a value completes to: one of its choices, a recipe (or a recipe file), a verlbox image, a path, or
# nothing (free text: a tag, a URL, a number, an override)
CHOICES, RECIPE, IMAGE, PATH, TEXT = "choices", "recipe", "image", "path", "text"
# options and positionals whose values are free text; every other value without choices is a path
TEXT_VALUES = {
    "tag",
    "base_image",
    "pip_index_url",
    "torch_index_url",
    "apt_mirror",
    "sources_url",
    "nvidia_repo_url",
    "check_timeout",
    "gpus_per_node",
    "nodes",
    "profile",
    "gpu_memory_gib",
    "repo",
    "revision",
    "validation_size",
    "extra",
    "overrides",
}
IMAGE_LABEL = "io.verlbox.recipe"
STAGING_PREFIX = "verlbox-build/"


@dataclass(frozen=True)
class Value:
    kind: str
    choices: tuple[str, ...] = ()


@dataclass(frozen=True)
class Option:
    flags: tuple[str, ...]
    help: str
    value: Value | None  # None: a flag that takes no value


@dataclass(frozen=True)
class Positional:
    name: str
    help: str
    value: Value
    optional: bool  # nargs ? or *
    repeats: bool  # nargs * or +


@dataclass(frozen=True)
class Command:
    name: str
    help: str
    options: tuple[Option, ...]
    positionals: tuple[Positional, ...]


def _value(action: argparse.Action) -> Value:
    if action.choices:
        return Value(CHOICES, tuple(str(choice) for choice in action.choices))
    if action.dest == "recipe":
        return Value(RECIPE)
    if action.dest == "image":
        return Value(IMAGE)
    return Value(TEXT if action.dest in TEXT_VALUES else PATH)


def _subcommands(parser: argparse.ArgumentParser) -> argparse._SubParsersAction:
    return next(action for action in parser._actions if isinstance(action, argparse._SubParsersAction))


def commands(parser: argparse.ArgumentParser) -> list[Command]:
    """Every command of PARSER with its options and positionals, as the completion scripts need them."""
    subcommands = _subcommands(parser)
    helps = {choice.dest: choice.help or "" for choice in subcommands._choices_actions}
    found = []
    for name, sub in subcommands.choices.items():
        options, positionals = [], []
        for action in sub._actions:
            if action.option_strings:
                takes_value = action.nargs != 0
                value = _value(action) if takes_value else None
                options.append(Option(tuple(action.option_strings), action.help or "", value))
            else:
                optional, repeats = action.nargs in ("?", "*"), action.nargs in ("*", "+")
                positionals.append(Positional(action.dest, action.help or "", _value(action), optional, repeats))
        found.append(Command(name, helps.get(name, ""), tuple(options), tuple(positionals)))
    return found


# --- bash ---


def _bash_words(words: list[str]) -> str:
    return " ".join(words)


def _bash_reply(value: Value) -> str:
    """Commands that fill COMPREPLY with VALUE's candidates for the word being completed ($cur)."""
    if value.kind == CHOICES:
        return f'COMPREPLY=($(compgen -W "{_bash_words(list(value.choices))}" -- "$cur"))'
    if value.kind == RECIPE:
        return "_verlbox_recipes"
    if value.kind == IMAGE:
        return "_verlbox_images"
    if value.kind == PATH:
        return "_verlbox_paths"
    return "COMPREPLY=()"


BASH_HEAD = """\
# bash completion for verlbox {version}, printed by `verlbox completion bash` from verlbox's own parser.
# Print it again after upgrading verlbox. Load it from ~/.local/share/bash-completion/completions/verlbox
# or with: source <(verlbox completion bash)

_verlbox_recipe_names="{recipes}"

_verlbox_paths() {{
    compopt -o filenames 2>/dev/null
    COMPREPLY=($(compgen -f -- "$cur"))
}}

_verlbox_recipes() {{  # a shipped recipe's name, or a recipe file once the word looks like a path
    if [[ "$cur" == */* || "$cur" == .* ]]; then
        _verlbox_paths
    else
        COMPREPLY=($(compgen -W "$_verlbox_recipe_names" -- "$cur"))
    fi
}}

_verlbox_images() {{  # the tagged verlbox images on the engine (staging tags are no image to use)
    local images
    images=$(docker image ls --filter label={label} --format '{{{{.Repository}}}}:{{{{.Tag}}}}' 2>/dev/null \\
        | grep -v -e '^{staging}' -e '<none>')
    COMPREPLY=($(compgen -W "$images" -- "$cur"))
}}
"""

BASH_MAIN = """\
_verlbox() {{
    local cur="${{COMP_WORDS[COMP_CWORD]}}" prev="${{COMP_WORDS[COMP_CWORD-1]}}"
    local command="" word index=0 i
    COMPREPLY=()
    for ((i = 1; i < COMP_CWORD; i++)); do
        word="${{COMP_WORDS[i]}}"
        if [[ -z "$command" ]]; then
            [[ "$word" != -* ]] && command="$word"
        elif [[ "$word" == "--" ]]; then  # shell's one command: bash's own completion
            compopt -o bashdefault -o default 2>/dev/null
            return
        elif [[ "$word" != -* ]] && ! _verlbox_takes_value "$command" "${{COMP_WORDS[i-1]}}"; then
            index=$((index + 1))
        fi
    done
    if [[ -z "$command" ]]; then
        COMPREPLY=($(compgen -W "{commands} -h --help --version" -- "$cur"))
    elif _verlbox_takes_value "$command" "$prev"; then
        _verlbox_value "$command" "$prev"
    elif [[ "$cur" == -* ]]; then
        _verlbox_options "$command"
    else
        _verlbox_positional "$command" "$index"
    fi
}}

complete -F _verlbox verlbox
"""


def bash_script(parser: argparse.ArgumentParser, recipes: list[str]) -> str:
    found = commands(parser)
    takes, values, options, positionals = [], [], [], []
    for command in found:
        for option in command.options:
            patterns = "|".join(f'"{command.name} {flag}"' for flag in option.flags)
            if option.value:
                takes.append(f"        {patterns}) return 0 ;;")
                values.append(f"        {patterns}) {_bash_reply(option.value)} ;;")
        flags = [flag for option in command.options for flag in option.flags]
        options.append(f'        {command.name}) COMPREPLY=($(compgen -W "{_bash_words(flags)}" -- "$cur")) ;;')
        for index, positional in enumerate(command.positionals):
            # a repeating positional takes every later word too (case takes the first pattern that matches)
            pattern = f'"{command.name} "*' if positional.repeats else f'"{command.name} {index}"'
            positionals.append(f"        {pattern}) {_bash_reply(positional.value)} ;;")

    def case(name: str, arguments: str, body: list[str], otherwise: str) -> str:
        lines = [
            f"{name}() {{  # {arguments}",
            '    case "$1 $2" in',
            *body,
            f"        *) {otherwise} ;;",
            "    esac",
            "}",
        ]
        return "\n".join(lines) + "\n"

    head = BASH_HEAD.format(
        version=__version__, recipes=_bash_words(recipes), label=IMAGE_LABEL, staging=STAGING_PREFIX
    )
    options_function = "\n".join(["_verlbox_options() {  # COMMAND", '    case "$1" in', *options, "    esac", "}"])
    return "\n".join(
        [
            head,
            case("_verlbox_takes_value", "COMMAND OPTION: does OPTION take a value?", takes, "return 1"),
            case("_verlbox_value", "COMMAND OPTION: the candidates for its value", values, "COMPREPLY=()"),
            options_function + "\n",
            case("_verlbox_positional", "COMMAND INDEX: the candidates for a positional", positionals, "COMPREPLY=()"),
            BASH_MAIN.format(commands=_bash_words([command.name for command in found])),
        ]
    )


# --- zsh ---


def _zsh_quoted(text: str, specials: str = "") -> str:
    """TEXT for inside single quotes, each of SPECIALS (a backslash first) escaped with a backslash."""
    for special in specials:
        text = text.replace(special, "\\" + special)
    return text.replace("'", "'\\''")


def _zsh_action(value: Value) -> str:
    if value.kind == CHOICES:
        return f"({' '.join(value.choices)})"
    return {RECIPE: "_verlbox_recipes", IMAGE: "_verlbox_images", PATH: "_files", TEXT: " "}[value.kind]


def _zsh_option(option: Option) -> str:
    help_text = _zsh_quoted(option.help.split(" (")[0][:120], "\\[]")  # inside _arguments' [description]
    name = max(option.flags, key=len).lstrip("-")
    value = f":{name}:{_zsh_action(option.value)}" if option.value else ""
    if len(option.flags) == 1:
        return f"'{option.flags[0]}[{help_text}]{value}'"
    exclusive = " ".join(option.flags)
    return f"'({exclusive})'{{{','.join(option.flags)}}}'[{help_text}]{value}'"


def _zsh_positional(index: int, positional: Positional) -> str:
    action = _zsh_action(positional.value)
    if positional.repeats:
        return f"'*:{positional.name}:{action}'"
    return f"'{index + 1}:{':' if positional.optional else ''}{positional.name}:{action}'"


ZSH_HEAD = """\
#compdef verlbox
# zsh completion for verlbox {version}, printed by `verlbox completion zsh` from verlbox's own parser.
# Print it again after upgrading verlbox. Save it as _verlbox in a folder on your $fpath, then run compinit.

_verlbox_recipes() {{
    _alternative 'recipes:recipe:({recipes})' 'files:recipe file:_files -g "*.y(a|)ml"'
}}

_verlbox_images() {{
    local -a images
    images=(${{(f)"$(docker image ls --filter label={label} --format '{{{{.Repository}}}}:{{{{.Tag}}}}' 2>/dev/null \\
        | grep -v -e '^{staging}' -e '<none>')"}})
    _describe -t images 'verlbox image' images
}}

_verlbox() {{
    local curcontext="$curcontext" state line
    local -a commands
    commands=(
{command_lines}
    )
    _arguments -C \\
        '(- *)'{{-h,--help}}'[show help]' \\
        '(- *)--version[show the version]' \\
        '1: :->command' \\
        '*:: :->arguments'
    case $state in
        command) _describe -t commands 'verlbox command' commands ;;
        arguments)
            curcontext="${{curcontext%:*:*}}:verlbox-$words[1]:"
            case $words[1] in
{command_cases}
            esac
            ;;
    esac
}}

_verlbox "$@"
"""


def zsh_script(parser: argparse.ArgumentParser, recipes: list[str]) -> str:
    found = commands(parser)
    command_lines = "\n".join(
        f"        '{_zsh_quoted(command.name, ':')}:{_zsh_quoted(command.help)}'" for command in found
    )
    cases = []
    for command in found:
        specs = [_zsh_option(option) for option in command.options]
        specs += [_zsh_positional(index, positional) for index, positional in enumerate(command.positionals)]
        joined = " \\\n                        ".join(specs)
        cases.append(f"                {command.name}) _arguments -s \\\n                        {joined} ;;")
    return ZSH_HEAD.format(
        version=__version__,
        recipes=" ".join(recipes),
        label=IMAGE_LABEL,
        staging=STAGING_PREFIX,
        command_lines=command_lines,
        command_cases="\n".join(cases),
    )


def completion(args: argparse.Namespace) -> int:
    from verlbox.cli import build_parser

    script = bash_script if args.shell == "bash" else zsh_script
    sys.stdout.write(script(build_parser(), recipe_names()))
    return 0
