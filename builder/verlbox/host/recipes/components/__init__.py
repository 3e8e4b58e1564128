"""The components an image is made of, in layer-cache order: what changes rarely comes first.

Apex's compile has a stage of its own; its wheel goes into the final image after verl's stack, so
that the final stage's downloads run while Apex compiles (and a new Apex wheel rebuilds only the
small layers after it). Adding a component is one module (schema, pins, template) and one line here.
"""

from __future__ import annotations

from verlbox.host.recipes.components.apex import Apex
from verlbox.host.recipes.components.base import Component
from verlbox.host.recipes.components.cudnn import Cudnn
from verlbox.host.recipes.components.python import Python
from verlbox.host.recipes.components.runtime import Runtime
from verlbox.host.recipes.components.torch import Torch
from verlbox.host.recipes.components.verl import Verl
from verlbox.host.recipes.components.vllm import Vllm

COMPONENTS: tuple[type[Component], ...] = (Python, Cudnn, Torch, Vllm, Verl, Apex, Runtime)

__all__ = ["COMPONENTS", "Apex", "Component", "Cudnn", "Python", "Runtime", "Torch", "Verl", "Vllm"]
