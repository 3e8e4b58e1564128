"""The Jinja environment every Dockerfile is rendered with: the templates (the shipped ones and each
component's own) and the filters that quote recipe values for a Dockerfile or a shell. Owned here so that
the plan (which renders its components' parts) and render (which renders the whole file) share it
without importing each other."""

from __future__ import annotations

import json
from collections.abc import Iterable

import jinja2

from verlbox.host.recipes.components import COMPONENTS
from verlbox.host.recipes.schema import no_control_characters, shell_quote


def _words(values: Iterable[object]) -> str:
    return " ".join(shell_quote(value) for value in values)


def _comment_text(value: object) -> str:
    # schema-checked text has no line breaks; checked again because a comment ends at one
    return no_control_characters(str(value))


def _label_value(value: object) -> str:
    # a JSON string is a valid Dockerfile quoted word once `$` cannot start a variable
    return json.dumps(str(value)).replace("$", "\\$")


def _labels(labels: dict[str, str]) -> str:
    return " \\\n      ".join(f"{key}={_label_value(value)}" for key, value in labels.items())


TEMPLATES = jinja2.Environment(
    loader=jinja2.ChoiceLoader(
        [
            jinja2.PackageLoader("verlbox.host.building", "templates"),
            jinja2.DictLoader({f"{component.key}.j2": component.template for component in COMPONENTS}),
        ]
    ),
    undefined=jinja2.StrictUndefined,
    keep_trailing_newline=False,
    trim_blocks=True,
    lstrip_blocks=True,
    autoescape=False,  # Dockerfiles, not HTML: recipe values go through `q`, `words`, `label` or `text`
)
TEMPLATES.filters |= {
    "q": shell_quote,
    "words": _words,
    "label": _label_value,
    "text": _comment_text,
    "labels": _labels,
}
