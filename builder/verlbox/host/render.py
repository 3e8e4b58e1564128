"""Dockerfile text from a build plan: deterministic, the same plan gives the same bytes."""

from __future__ import annotations

import json
from collections.abc import Iterable
from typing import TYPE_CHECKING

import jinja2

from verlbox.host.components import COMPONENTS
from verlbox.host.lock import installing_steps
from verlbox.host.schema import no_control_characters, shell_quote

if TYPE_CHECKING:
    from verlbox.host.plan import BuildPlan


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
            jinja2.PackageLoader("verlbox.host", "templates"),
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


def render_dockerfile(plan: BuildPlan) -> str:
    text = TEMPLATES.get_template("Dockerfile.j2").render(plan=plan).rstrip("\n") + "\n"
    if plan.lock:  # checked against what this Dockerfile installs, before anything reads the lock's slices
        plan.lock.check_steps(list(installing_steps(text)), plan.recipe.lock_path, offline=plan.offline)
    return text
