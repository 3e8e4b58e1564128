"""The components an image is made of, in layer-cache order: what changes rarely comes first.

Apex's compile has a stage of its own; its wheel goes into the final image after verl's stack, so
that the final stage's downloads run while Apex compiles (and a new Apex wheel rebuilds only the
small layers after it). Adding a component is one module (schema, pins, template) and one line here.
"""

from __future__ import annotations

from verlbox.host.components.apex import Apex
from verlbox.host.components.base import Component
from verlbox.host.components.cudnn import Cudnn
from verlbox.host.components.python import Python
from verlbox.host.components.runtime import Runtime
from verlbox.host.components.torch import Torch
from verlbox.host.components.verl import Verl
from verlbox.host.components.vllm import Vllm

COMPONENTS: tuple[type[Component], ...] = (Python, Cudnn, Torch, Vllm, Verl, Apex, Runtime)

__all__ = ["COMPONENTS", "Apex", "Component", "Cudnn", "Python", "Runtime", "Torch", "Verl", "Vllm"]
