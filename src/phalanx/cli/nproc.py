"""``--nproc-per-node``: a number, or one of torchrun's words for "one per device"."""

from __future__ import annotations

import os
from collections.abc import Callable

from phalanx import parsing


def xpu_device_count() -> int:
    import torch

    xpu = getattr(torch, "xpu", None)
    return int(xpu.device_count()) if xpu is not None and xpu.is_available() else 0


def cuda_device_count() -> int:
    import torch  # imported only for auto/gpu: the launcher itself does not need torch

    return int(torch.cuda.device_count()) if torch.cuda.is_available() else 0


def resolve_nproc(
    text: str,
    cuda_device_count: Callable[[], int],
    xpu_devices: Callable[[], int] = xpu_device_count,
) -> int:
    """``N``, ``auto`` (GPUs if any, else CPUs), ``cpu``, ``gpu`` or ``xpu``, as torchrun
    reads it."""
    value = str(text).strip().lower()
    if value == "cpu":
        return os.cpu_count() or 1
    if value == "xpu":
        if (count := xpu_devices()) > 0:
            return count
        raise ValueError("--nproc-per-node xpu: no XPU device is visible")
    if value in {"gpu", "auto"}:
        count = cuda_device_count()
        if count > 0:
            return count
        if value == "gpu":
            raise ValueError("--nproc-per-node gpu: no CUDA device is visible")
        return os.cpu_count() or 1
    if not value.lstrip("+-").isdigit():
        raise ValueError(
            f"--nproc-per-node: expected a positive integer, auto, cpu, gpu or xpu, got {text!r}"
        )
    return parsing.parse_int(text, "--nproc-per-node", minimum=1)
