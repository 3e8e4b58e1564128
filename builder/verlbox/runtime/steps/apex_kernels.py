"""Apex's fused CUDA kernels against torch references, on a GPU: what smoke's GPU tier and the Apex
benchmark run. Each comparison gives the largest absolute difference and the tolerance it must meet.

Only torch and apex are imported (no other verlbox module), so the file also runs on a GPU machine
where Apex was built outside an image.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass

# what "matches" means per dtype: fp16 rounds at ~1e-3 relative; sums over a row add a little more
TOLERANCE = {"float32": 1e-4, "float16": 2e-2}


@dataclass(frozen=True)
class KernelCheck:
    kernel: str
    dtype: str
    max_error: float
    tolerance: float

    @property
    def ok(self) -> bool:
        return self.max_error <= self.tolerance


def _max_error(got: object, want: object) -> float:
    return float((got.float() - want.float()).abs().max().item())  # type: ignore[attr-defined]


def _normalization(torch: object, fused: type, reference: Callable, dtype: object) -> list[float]:
    """Forward output and input/weight gradients of a fused norm against the reference on the same data."""
    shape = (64, 896)
    x = torch.randn(shape, device="cuda", dtype=dtype)
    grad = torch.randn(shape, device="cuda", dtype=dtype)
    layer = fused(shape[-1]).cuda().to(dtype)
    x_fused, x_ref = x.clone().requires_grad_(), x.clone().requires_grad_()
    weight_ref = layer.weight.detach().clone().requires_grad_()
    out_fused = layer(x_fused)
    out_ref = reference(x_ref, weight_ref)
    out_fused.backward(grad)
    out_ref.backward(grad)
    return [
        _max_error(out_fused, out_ref),
        _max_error(x_fused.grad, x_ref.grad),
        _max_error(layer.weight.grad, weight_ref.grad),
    ]


def compare_kernels() -> list[KernelCheck]:
    import amp_C
    import torch
    from apex.multi_tensor_apply import multi_tensor_applier
    from apex.normalization import FusedLayerNorm, FusedRMSNorm
    from apex.optimizers import FusedAdam

    torch.manual_seed(0)
    checks: list[KernelCheck] = []

    def layer_norm(x: object, weight: object) -> object:
        return torch.nn.functional.layer_norm(x, x.shape[-1:], weight, torch.zeros_like(weight), 1e-5)

    def rms_norm(x: object, weight: object) -> object:
        variance = x.float().pow(2).mean(-1, keepdim=True)
        return (x.float() * torch.rsqrt(variance + 1e-5)).to(x.dtype) * weight

    for dtype in (torch.float32, torch.float16):
        name = str(dtype).removeprefix("torch.")
        tolerance = TOLERANCE[name]
        for kernel, fused, reference in (
            ("FusedLayerNorm", FusedLayerNorm, layer_norm),
            ("FusedRMSNorm", FusedRMSNorm, rms_norm),
        ):
            forward, grad_input, grad_weight = _normalization(torch, fused, reference, dtype)
            checks += [
                KernelCheck(f"{kernel} forward", name, forward, tolerance),
                KernelCheck(f"{kernel} backward (input)", name, grad_input, tolerance * 10),
                KernelCheck(f"{kernel} backward (weight)", name, grad_weight, tolerance * 100),
            ]

        tensors = [torch.randn(n, device="cuda", dtype=dtype) for n in (1000, 4096, 77)]
        scaled = [torch.empty_like(t) for t in tensors]
        overflow = torch.zeros(1, dtype=torch.int, device="cuda")
        multi_tensor_applier(amp_C.multi_tensor_scale, overflow, [tensors, scaled], 0.5)
        checks.append(
            KernelCheck(
                "amp_C.multi_tensor_scale",
                name,
                max(_max_error(s, t * 0.5) for s, t in zip(scaled, tensors, strict=True)),
                0.0,
            )
        )
        norm, _ = multi_tensor_applier(amp_C.multi_tensor_l2norm, overflow, [tensors], False)
        reference_norm = torch.linalg.vector_norm(torch.cat([t.float() for t in tensors]))
        checks.append(KernelCheck("amp_C.multi_tensor_l2norm", name, _max_error(norm, reference_norm), tolerance * 10))

    # FusedAdam (AdamW mode) against torch's AdamW: five steps on the same parameters and gradients.
    # FusedAdam keeps its state and does its arithmetic in fp32 even for fp16 parameters; torch's AdamW on
    # fp16 parameters does not (its eps=1e-8 underflows to 0 in fp16), so the fp16 reference runs on fp32
    # copies and is rounded to fp16 once at the end.
    for dtype, tolerance in ((torch.float32, 1e-5), (torch.float16, 1e-2)):
        params = [torch.randn(n, device="cuda").to(dtype) for n in (1000, 4096)]
        fused_params = [p.clone().requires_grad_() for p in params]
        torch_params = [p.float().clone().requires_grad_() for p in params]
        fused_adam = FusedAdam(fused_params, lr=1e-3, weight_decay=0.01, adam_w_mode=True)
        torch_adam = torch.optim.AdamW(torch_params, lr=1e-3, weight_decay=0.01)
        for _ in range(5):
            for fused_param, torch_param in zip(fused_params, torch_params, strict=True):
                grad = torch.randn_like(fused_param)
                fused_param.grad, torch_param.grad = grad.clone(), grad.float().clone()
            fused_adam.step()
            torch_adam.step()
        error = max(_max_error(f, t.to(dtype)) for f, t in zip(fused_params, torch_params, strict=True))
        checks.append(KernelCheck("FusedAdam (AdamW, 5 steps)", str(dtype).removeprefix("torch."), error, tolerance))
    return checks
