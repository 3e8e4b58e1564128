"""A real Ray cluster from the built image: a head and a worker container on a user-defined network.

No GPU: the task placed on the worker proves the two containers form one cluster, and `train` on the
head runs the cluster preflight against it (which must fail there, one sentence per problem).
"""

from __future__ import annotations

import json
import subprocess
import time
import uuid
from collections.abc import Iterator
from dataclasses import dataclass

import pytest

from conftest import docker

pytestmark = pytest.mark.docker

# placed on the node that is not the head; reports where it ran
ON_THE_WORKER = """
import json, socket, ray
from ray.util.scheduling_strategies import NodeAffinitySchedulingStrategy
ray.init(address="auto", logging_level="ERROR")
head = ray.get_runtime_context().get_node_id()
worker = next(n["NodeID"] for n in ray.nodes() if n["Alive"] and n["NodeID"] != head)
where = ray.remote(num_cpus=1)(lambda: socket.gethostname())
strategy = NodeAffinitySchedulingStrategy(worker, soft=False)
print(json.dumps({"nodes": len([n for n in ray.nodes() if n["Alive"]]),
                  "ran_on": ray.get(where.options(scheduling_strategy=strategy).remote(), timeout=60)}))
"""

COUNT_NODES = (
    "import ray; ray.init(address='auto', logging_level='ERROR'); print(len([n for n in ray.nodes() if n['Alive']]))"
)


@dataclass(frozen=True)
class Cluster:
    head: str
    worker: str
    address: str


def _ray_node(image: str, name: str, network: str, volume: str, *ray_args: str) -> None:
    docker(
        "run", "-d", "--name", name, "--hostname", name, "--network", network, "--shm-size", "1g",
        "-v", f"{volume}:/shared", "--entrypoint", "ray", image,
        "start", "--num-cpus", "1", "--num-gpus", "0", "--disable-usage-stats", "--block", *ray_args,
    )  # fmt: skip


def _wait_for_nodes(head: str, count: int, timeout_s: float = 60) -> None:
    deadline = time.monotonic() + timeout_s
    seen = ""
    while time.monotonic() < deadline:
        seen = docker("exec", head, "python", "-c", COUNT_NODES, check=False).stdout.strip()
        if seen == str(count):
            return
        time.sleep(1)
    logs = docker("logs", head, check=False)
    pytest.fail(f"the cluster never had {count} nodes (last count {seen!r}): {(logs.stdout + logs.stderr)[-2000:]}")


@pytest.fixture(scope="module")
def cluster(image: str) -> Iterator[Cluster]:
    suffix = uuid.uuid4().hex[:8]
    network, volume = f"verlbox-ci-{suffix}", f"verlbox-ci-shared-{suffix}"
    head, worker = f"vbx-head-{suffix}", f"vbx-worker-{suffix}"
    docker("network", "create", network)
    try:
        _ray_node(image, head, network, volume, "--head", "--port", "6379", "--include-dashboard", "false")
        _ray_node(image, worker, network, volume, "--address", f"{head}:6379")
        _wait_for_nodes(head, 2)
        yield Cluster(head, worker, f"{head}:6379")
    finally:
        docker("rm", "-f", head, worker, check=False)
        docker("network", "rm", network, check=False)
        docker("volume", "rm", "-f", volume, check=False)


def test_a_task_placed_on_the_worker_runs_there(cluster: Cluster) -> None:
    result = docker("exec", cluster.head, "python", "-c", ON_THE_WORKER, timeout=120)
    report = json.loads(result.stdout.strip().splitlines()[-1])
    assert report == {"nodes": 2, "ran_on": cluster.worker}


def _train(cluster: Cluster, checkpoints: str, *flags: str) -> subprocess.CompletedProcess[str]:
    return docker(
        "exec", "-e", f"RAY_ADDRESS={cluster.address}", "-e", f"VERLBOX_CHECKPOINT_DIR={checkpoints}",
        cluster.head, "verlbox", "train", *flags, check=False, timeout=180,
    )  # fmt: skip


def test_cluster_preflight_names_each_problem_in_one_sentence(cluster: Cluster) -> None:
    # each container has its own /tmp: the worker cannot see what the head writes there
    result = _train(cluster, "/tmp/checkpoints", "--gpus-per-node", "1", "--nodes", "2")
    assert result.returncode == 3, result.stderr[-3000:]
    failures = {line.split(":")[0]: line for line in result.stderr.splitlines() if line.startswith("preflight ")}
    assert "training needs 2 node(s) with 1 GPU(s) each but the Ray cluster has 0" in failures["preflight cluster GPUs"]
    assert f"{cluster.worker} (" in failures["preflight shared checkpoints"]
    assert f"{cluster.head} (" not in failures["preflight shared checkpoints"]
    assert "lacks /models/Qwen2.5-0.5B-Instruct" in failures["preflight node files"]
    # both containers run the same image, and the probe ran on both
    assert "preflight same image" not in failures and "preflight cluster probe" not in failures
    assert all(line.count(". ") <= 1 for line in failures.values()), failures


def test_a_shared_folder_passes_the_checkpoint_check(cluster: Cluster) -> None:
    result = _train(cluster, "/shared", "--gpus-per-node", "1", "--nodes", "2")
    assert result.returncode == 3, result.stderr[-3000:]
    assert "preflight cluster GPUs" in result.stderr
    assert "preflight shared checkpoints" not in result.stderr
    leftovers = docker("exec", cluster.worker, "sh", "-c", "ls -A /shared/qwen2.5-0.5b-gsm8k-ppo").stdout
    assert ".verlbox-cluster-check-" not in leftovers


def test_detection_reads_the_clusters_shape(cluster: Cluster) -> None:
    """Without flags, train takes its shape from the cluster: two nodes, neither with a GPU."""
    result = _train(cluster, "/shared")
    assert result.returncode == 3
    assert f"the Ray cluster at {cluster.address} has no GPU" in result.stderr
