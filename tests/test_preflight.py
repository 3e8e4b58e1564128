"""Preflight checks and the GPU table, fed the facts of GPUs this machine does not have."""

from __future__ import annotations

from pathlib import Path

import pytest

from conftest import run_verlbox
from test_data import hide_modules
from verlbox.runtime.gpu import UnsupportedGpu, capability_for, has_code_for, rollout_backend
from verlbox.runtime.training import preflight
from verlbox.runtime.training.preflight import GpuDevice, GpuFacts, NodeFacts

PYPI_TORCH_26 = ["sm_50", "sm_60", "sm_70", "sm_75", "sm_80", "sm_86", "sm_90"]
P40 = GpuDevice("Tesla P40", "6.1", 22.4, 22.2)


def facts(*devices: GpuDevice, driver_cuda: str = "12.4", archs: list[str] = PYPI_TORCH_26) -> GpuFacts:
    return GpuFacts(list(devices), archs, driver_cuda, "550.54.14")


def test_capability_table() -> None:
    pascal = capability_for("6.1")
    assert (pascal.dtype, pascal.attention, pascal.torch_compile, pascal.flash_attention, pascal.bf16) == (
        "float32",
        "sdpa",
        False,
        False,
        False,
    )
    assert capability_for("8.0").attention == "flash_attention_2" and capability_for("9.0").bf16
    assert capability_for("7.5").torch_compile and not capability_for("7.5").bf16
    with pytest.raises(UnsupportedGpu, match="older than anything verlbox supports"):
        capability_for("5.2")


def test_rollout_backend_needs_vllm_kernels_for_the_gpu() -> None:
    stock = ["7.0", "7.5", "8.0", "8.6", "8.9", "9.0"]
    assert rollout_backend("6.1", stock) == "hf"
    assert rollout_backend("6.1", ["6.0", "6.1"]) == "vllm"
    assert rollout_backend("8.0", stock) == "vllm" and rollout_backend("8.0", None) == "hf"


def test_sm60_code_runs_on_61_but_not_the_other_way() -> None:
    assert has_code_for("6.1", ["sm_60"]) and not has_code_for("6.0", ["sm_61"])
    assert not has_code_for("6.1", ["sm_70", "sm_80"]) and has_code_for("8.9", ["compute_80"])


def test_a_p40_passes_every_gpu_check() -> None:
    p40 = facts(P40)
    checks = [
        preflight.check_gpu_visible(p40, 1),
        preflight.check_compute_capability(p40, ["6.1"]),
        preflight.check_driver(p40, "12.4"),
        preflight.check_memory(p40, 20),
    ]
    assert all(check.ok for check in checks), checks


def test_no_gpu_is_one_sentence() -> None:
    check = preflight.check_gpu_visible(facts(), 1)
    assert not check.ok and "0 are visible" in check.detail and "--gpus all" in check.detail


def test_older_gpu_and_missing_torch_code_fail() -> None:
    maxwell = facts(GpuDevice("Tesla M40", "5.2", 24, 24))
    assert "older than anything" in preflight.check_compute_capability(maxwell, ["6.1"]).detail
    no_code = preflight.check_compute_capability(facts(P40, archs=["sm_75", "sm_80"]), ["6.1"])
    assert not no_code.ok and "no code for Tesla P40" in no_code.detail


def test_newer_gpu_passes_with_a_note() -> None:
    check = preflight.check_compute_capability(facts(GpuDevice("NVIDIA H200", "9.0", 139, 138)), ["6.1"])
    assert check.ok and "still runs there" in check.detail


def test_driver_too_old_names_the_driver_to_install() -> None:
    old = preflight.check_driver(facts(P40, driver_cuda="11.4"), "12.4")
    assert not old.ok and "install driver >= 550.54.14" in old.detail
    minor = preflight.check_driver(facts(P40, driver_cuda="12.2"), "12.4")
    assert minor.ok and "minor-version compatibility (>= 525.60.13)" in minor.detail
    assert not preflight.check_driver(GpuFacts([P40], [], None, None), "11.8").ok


def test_memory_respects_the_emulation_cap() -> None:
    assert preflight.check_memory(facts(P40), 20).ok
    busy = preflight.check_memory(facts(GpuDevice("Tesla P40", "6.1", 22.4, 9.0)), 20)
    assert not busy.ok and "9.0 GiB free" in busy.detail
    capped = GpuFacts([GpuDevice("NVIDIA H200", "9.0", 139, 138)], [], "13.0", None, memory_cap_gib=16)
    assert not preflight.check_memory(capped, 20).ok


def test_model_folder_checks(tmp_path: Path) -> None:
    empty = preflight.check_model(tmp_path / "nothing").detail
    assert "no config.json" in empty
    assert f"`verlbox fetch model --out {tmp_path / 'nothing'}` (README: Model and data)" in empty
    (tmp_path / "config.json").write_text("{}")
    assert "no weights" in preflight.check_model(tmp_path).detail


def test_small_shm_fails(tmp_path: Path) -> None:
    assert preflight.check_shared_memory(minimum_gib=10**6, shm=Path("/dev/shm")).ok is False
    assert preflight.check_shared_memory(shm=tmp_path / "absent").ok


def test_dead_variables_are_named() -> None:
    notes = preflight.dead_variables({"VLLM_DTYPE": "float32", "PATH": "/bin"})
    assert notes == ["VLLM_DTYPE is set but vLLM never reads it; the rollout dtype is actor_rollout_ref.rollout.dtype"]


def node(name: str, *devices: GpuDevice, recipe_hash: str = "abc123", marker: str | None = "token") -> NodeFacts:
    return NodeFacts(name, facts(*devices), recipe_hash, marker)


def test_a_cluster_of_two_p40_hosts_passes_every_cluster_check() -> None:
    nodes = [node("head (10.0.0.1)", P40, P40), node("box2 (10.0.0.2)", P40, P40)]
    checks = [
        preflight.check_cluster_probe(nodes),
        preflight.check_cluster_gpus(nodes, 2, 2),
        preflight.check_cluster_compute_capability(nodes, ["6.1"]),
        preflight.check_cluster_driver(nodes, "12.4"),
        preflight.check_cluster_memory(nodes, 20),
        preflight.check_same_image(nodes, "abc123"),
        preflight.check_shared_checkpoints(nodes, "/checkpoints/x", "token"),
        preflight.check_node_files(nodes),
    ]
    assert all(check.ok for check in checks), checks


def test_too_few_gpus_counts_nodes_that_share_a_host() -> None:
    two_on_one_host = [node("h (10.0.0.1)", P40), node("h (10.0.0.1)", P40)]
    assert preflight.check_cluster_gpus(two_on_one_host, 1, 2).ok
    short = preflight.check_cluster_gpus([node("a (10.0.0.1)", P40, P40), node("b (10.0.0.2)", P40)], 2, 2)
    assert not short.ok
    assert "needs 2 node(s) with 2 GPU(s) each but the Ray cluster has 1" in short.detail
    assert "a (10.0.0.1) 2, b (10.0.0.2) 1" in short.detail


def test_each_cluster_failure_names_the_node_in_one_sentence() -> None:
    maxwell = GpuDevice("Tesla M40", "5.2", 24, 24)
    nodes = [
        node("head (10.0.0.1)", P40),
        node("old (10.0.0.2)", maxwell, recipe_hash="ffff00", marker=None),
        NodeFacts("bare (10.0.0.3)", facts(P40), None, "token", ("/models/Qwen2.5-0.5B-Instruct",)),
    ]
    capability = preflight.check_cluster_compute_capability(nodes, ["6.1"])
    assert not capability.ok and capability.detail.startswith("old (10.0.0.2): Tesla M40")
    image = preflight.check_same_image(nodes, "abc123")
    assert not image.ok and "old (10.0.0.2) (ffff00), bare (10.0.0.3) (no verlbox image)" in image.detail
    shared = preflight.check_shared_checkpoints(nodes, "/checkpoints/x", "token")
    assert not shared.ok and shared.detail.startswith("old (10.0.0.2) cannot see the file the head wrote")
    files = preflight.check_node_files(nodes)
    assert not files.ok and files.detail.startswith("bare (10.0.0.3) lacks /models/Qwen2.5-0.5B-Instruct")
    for check in (capability, image, shared, files):
        assert "\n" not in check.detail


def test_a_node_whose_probe_failed_is_named() -> None:
    nodes = [node("head (10.0.0.1)", P40), NodeFacts("w (10.0.0.2)", error="ModuleNotFoundError: verlbox")]
    check = preflight.check_cluster_probe(nodes)
    assert not check.ok and "w (10.0.0.2) (ModuleNotFoundError: verlbox)" in check.detail


def test_train_on_a_host_without_the_stack_says_where_it_runs(tmp_path: Path) -> None:
    result = run_verlbox("train", "--recipe", "p40-cu124", "--dry-run", env=hide_modules(tmp_path, "torch", "verl"))
    assert result.returncode == 2
    assert result.stderr == (
        "verlbox: error: train runs inside the image (torch and verl not installed here): `docker compose up train` "
        "in a run folder, or `verlbox shell -- verlbox train --dry-run` to see its command; "
        "`verlbox overrides p40-cu124` checks its overrides here\n"
    )
    assert result.stdout == ""
    # no recipe given either: where train runs still comes first (before: "pass --recipe")
    (tmp_path / "bare").mkdir()
    bare = run_verlbox("train", env=hide_modules(tmp_path / "bare", "torch", "verl"))
    assert bare.returncode == 2 and bare.stderr.startswith("verlbox: error: train runs inside the image"), bare.stderr


FAKE_TORCH = """
import os
from types import SimpleNamespace
version = SimpleNamespace(cuda="12.4")
_C = SimpleNamespace(_cuda_getArchFlags=lambda: "sm_60 sm_70")


class cuda:
    @staticmethod
    def is_available():
        return True

    @staticmethod
    def device_count():
        return 1

    @staticmethod
    def get_device_properties(index):
        return SimpleNamespace(name="Tesla P40", major=6, minor=1)

    @staticmethod
    def mem_get_info(index):  # what makes a CUDA context: the marker says which process asked
        with open(os.environ["CONTEXT_MARKER"], "a") as marker:
            marker.write(f"{os.getpid()}\\n")
        return 23 * 2**30, 24 * 2**30
"""


def test_the_gpu_is_probed_by_a_child_so_the_supervising_process_holds_no_cuda_context(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """mem_get_info makes a CUDA context (518 MiB measured on the H200) that stayed with `verlbox train` for the
    whole run. The facts now come from a child process; this one never imports torch."""
    import os
    import sys

    (tmp_path / "torch").mkdir()
    (tmp_path / "torch" / "__init__.py").write_text(FAKE_TORCH)
    marker = tmp_path / "contexts"
    monkeypatch.setenv("PYTHONPATH", os.pathsep.join([str(tmp_path), *sys.path]))
    monkeypatch.setenv("CONTEXT_MARKER", str(marker))
    monkeypatch.delenv("VERLBOX_GPU_MEMORY_GIB", raising=False)
    facts = preflight.probe_gpu()
    assert [(d.name, d.compute_capability, d.total_gib) for d in facts.devices] == [("Tesla P40", "6.1", 24.0)]
    assert facts.compiled_archs == ["sm_60", "sm_70"]
    (asked_by,) = marker.read_text().split()
    assert int(asked_by) != os.getpid() and "torch" not in sys.modules
