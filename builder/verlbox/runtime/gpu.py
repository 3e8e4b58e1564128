"""What a GPU generation can do, by compute capability, and what a CUDA version asks of the driver.

The training profile is checked against this table and the preflight uses it on the real GPU.
"""

from __future__ import annotations

from dataclasses import dataclass

from packaging.version import Version

from verlbox.errors import UsageError


@dataclass(frozen=True)
class GpuCapability:
    generation: str
    min_compute_capability: str
    dtype: str  # what verl's models should compute in
    attention: str  # transformers' attn_implementation
    torch_compile: bool  # Triton (and so torch.compile) refuses CC < 7.0
    flash_attention: bool
    bf16: bool


# Newest first: the first row whose minimum the GPU reaches applies.
CAPABILITIES = (
    GpuCapability("Ampere and newer", "8.0", "bfloat16", "flash_attention_2", True, True, True),
    GpuCapability("Volta/Turing", "7.0", "float32", "sdpa", True, False, False),
    GpuCapability("Pascal", "6.0", "float32", "sdpa", False, False, False),
)

# Minimum NVIDIA driver per CUDA runtime: (full support, with minor-version compatibility).
# From NVIDIA's CUDA toolkit release notes, table 3 (toolkit driver versions).
CUDA_MIN_DRIVER = {
    "11.8": ("520.61.05", "450.80.02"),
    "12.4": ("550.54.14", "525.60.13"),
}


class UnsupportedGpu(UsageError):
    pass


def capability_for(compute_capability: str) -> GpuCapability:
    for row in CAPABILITIES:
        if Version(compute_capability) >= Version(row.min_compute_capability):
            return row
    raise UnsupportedGpu(
        f"compute capability {compute_capability} is older than anything verlbox supports "
        f"(oldest: {CAPABILITIES[-1].min_compute_capability}, {CAPABILITIES[-1].generation})"
    )


def rollout_backend(compute_capability: str, vllm_kernels_for: list[str] | None) -> str:
    """vLLM only where the installed vLLM has kernels for this GPU; verl's HF rollout otherwise."""
    if vllm_kernels_for and compute_capability in vllm_kernels_for:
        return "vllm"
    return "hf"


def has_code_for(compute_capability: str, compiled_archs: list[str]) -> bool:
    """sm_XY machine code runs on the same major at a minor >= Y; compute_XY PTX on anything newer."""
    major, minor = (int(part) for part in compute_capability.split("."))
    for arch in compiled_archs:
        kind, _, digits = arch.partition("_")
        arch_major, arch_minor = int(digits[:-1]), int(digits[-1])
        if kind == "sm" and arch_major == major and arch_minor <= minor:
            return True
        if kind == "compute" and (arch_major, arch_minor) <= (major, minor):
            return True
    return False
