"""The Ray cluster a run joins (RAY_ADDRESS): its shape, and what every node says about itself.

Only gathering lives here; the checks over the gathered facts are plain functions in preflight.py.
The probe runs as one Ray task per node, pinned there, holding all of that node's GPUs so it sees
what verl's workers will see; it imports verlbox, so a node that does not run the image fails it.
"""

from __future__ import annotations

import dataclasses
import os
import socket
import time
import uuid
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import Any

from rich.console import Console

from verlbox.errors import VerlboxError
from verlbox.runtime.training.preflight import NodeFacts, probe_gpu
from verlbox.runtime.training.profile import Topology
from verlbox.runtime.training.spec import baked_spec

PROBE_TIMEOUT_S = 180.0
MARKER_PREFIX = ".verlbox-cluster-check-"


def connect(address: str) -> None:
    import ray

    try:
        ray.init(address=address, logging_level="ERROR", log_to_driver=False, configure_logging=False)
    except (ConnectionError, RuntimeError, ValueError) as exc:
        raise VerlboxError(
            f"no Ray cluster answers at RAY_ADDRESS={address} ({' '.join(str(exc).split())[:200]}): "
            "start ray-head first (docker compose --profile cluster up ray-head)"
        ) from None


def disconnect() -> None:
    import ray

    ray.shutdown()


def alive_nodes() -> list[dict[str, Any]]:
    import ray

    return [node for node in ray.nodes() if node.get("Alive")]


def node_name(node: dict[str, Any]) -> str:
    return f"{node.get('NodeManagerHostname', '?')} ({node.get('NodeManagerAddress', '?')})"


def wait_for_nodes(count: int, timeout_s: float, console: Console) -> None:
    """Workers join a few seconds to minutes after the head: wait for them rather than fail at once."""
    deadline = time.monotonic() + timeout_s
    announced = -1
    while (joined := len(alive_nodes())) < count and time.monotonic() < deadline:
        if joined != announced:
            console.print(f"waiting for {count} Ray nodes ({joined} joined, up to {timeout_s:g} s)")
            announced = joined
        time.sleep(2)


def cluster_topology(address: str) -> Topology:
    """verl places n_gpus_per_node workers on each of nnodes nodes: every node with a GPU, each as much
    as the smallest of them has."""
    gpus = [int(node["Resources"].get("GPU", 0)) for node in alive_nodes()]
    with_gpus = [count for count in gpus if count > 0]
    if not with_gpus:
        return Topology(1, 1, f"the Ray cluster at {address} has no GPU")
    return Topology(min(with_gpus), len(with_gpus), f"the Ray cluster at {address}")


def probe_node(marker: str, paths: list[str], memory_cap_gib: float | None) -> NodeFacts:
    """Runs on one node (a Ray task): its GPUs, its image, and whether it sees the head's files."""
    spec = baked_spec()
    marker_file = Path(marker)
    gpu = probe_gpu()
    if memory_cap_gib:
        gpu = dataclasses.replace(gpu, memory_cap_gib=memory_cap_gib)
    return NodeFacts(
        name=socket.gethostname(),
        gpu=gpu,
        recipe_hash=spec.recipe_hash if spec else None,
        marker=marker_file.read_text() if marker_file.is_file() else None,
        missing=tuple(path for path in paths if not os.path.exists(path)),
    )


@contextmanager
def marker_in(folder: Path) -> Iterator[tuple[Path, str]]:
    """A file only this head wrote, which every node must see at the same path."""
    folder.mkdir(parents=True, exist_ok=True)
    token = uuid.uuid4().hex
    marker = folder / f"{MARKER_PREFIX}{token}"
    marker.write_text(token)
    try:
        yield marker, token
    finally:
        marker.unlink(missing_ok=True)


def probe_nodes(marker: Path, paths: list[str], memory_cap_gib: float | None) -> list[NodeFacts]:
    import ray
    from ray.util.scheduling_strategies import NodeAffinitySchedulingStrategy

    # max_calls=1: the worker exits afterwards, so the CUDA context the probe made frees its GPU memory
    probe = ray.remote(max_calls=1, num_cpus=0)(probe_node)
    nodes = alive_nodes()
    pending = {
        probe.options(
            num_gpus=node["Resources"].get("GPU", 0),
            scheduling_strategy=NodeAffinitySchedulingStrategy(node["NodeID"], soft=False),
        ).remote(str(marker), paths, memory_cap_gib): node
        for node in nodes
    }
    ready, _ = ray.wait(list(pending), num_returns=len(pending), timeout=PROBE_TIMEOUT_S)
    facts = []
    for ref, node in pending.items():
        name = node_name(node)
        if ref not in ready:
            facts.append(NodeFacts(name, error=f"no answer in {PROBE_TIMEOUT_S:g} s: are its GPUs busy?"))
            continue
        try:
            reported = ray.get(ref)
        except Exception as exc:  # whatever broke on that node is reported as that node's failure
            facts.append(NodeFacts(name, error=" ".join(str(exc).split())[-200:]))
            continue
        facts.append(dataclasses.replace(reported, name=name))
    return facts
