"""Accelerator figures, roofline step time, whether a step fits, and what would make it fit.

Peak figures are the vendors' dense (no sparsity) bf16 matmul rates and HBM bandwidths:

    H100  NVIDIA H100 Tensor Core GPU datasheet, SXM5: 989 TFLOP/s bf16 dense (1,979 with
          sparsity), 3.35 TB/s HBM3, 80 GB.
    H200  NVIDIA H200 Tensor Core GPU product page / datasheet, SXM: 989 TFLOP/s bf16 dense
          (1,979 with sparsity), 4.8 TB/s HBM3e, 141 GB.
    A100  NVIDIA A100 Tensor Core GPU datasheet, SXM 80GB: 312 TFLOP/s bf16 dense, 2,039 GB/s
          HBM2e, 80 GB.
    v5e   Google Cloud TPU v5e documentation (system architecture): 197 TFLOP/s bf16,
          819 GB/s, 16 GiB HBM2 per chip.
    v5p   Google Cloud TPU v5p documentation (system architecture): 459 TFLOP/s bf16,
          2,765 GB/s, 95 GiB HBM2e per chip.

Add an accelerator with `register_accelerator(Accelerator(...))`, or name one on the command
line as `name:peak_flops:bandwidth_bytes_per_s:memory_bytes` (`accelerator("x:400e12:2e12:64e9")`).

Roofline time of a piece = max(FLOPs / peak, HBM bytes / bandwidth); a step is the sum of its
pieces (sampling is bandwidth-bound at small batch, the update compute-bound). It is a lower
bound: real steps reach some fraction of it (the model-FLOPs utilisation).
"""

from __future__ import annotations

import dataclasses
import math
from typing import Mapping

from derl_jax.plan import analytic
from derl_jax.plan.analytic import RunShape

GIB = 1 << 30
# JAX's GPU allocator takes this share of each device's memory unless the environment says
# otherwise (JAX's "GPU memory allocation" page); a plan fits what the process will have.
DEFAULT_MEMORY_FRACTION = 0.75
MEMORY_FRACTION_ENV = ("XLA_CLIENT_MEM_FRACTION", "XLA_PYTHON_CLIENT_MEM_FRACTION")
PREALLOCATE_ENV = "XLA_PYTHON_CLIENT_PREALLOCATE"
ALLOCATOR_ENV = "XLA_PYTHON_CLIENT_ALLOCATOR"


@dataclasses.dataclass(frozen=True)
class Accelerator:
    """peak_flops: dense bf16 FLOP/s; bandwidth: HBM bytes/s; memory: HBM bytes per device."""

    name: str
    peak_flops: float
    bandwidth: float
    memory: float

    def __post_init__(self):
        for field in ("peak_flops", "bandwidth", "memory"):
            value = getattr(self, field)
            if not isinstance(value, (int, float)) or not math.isfinite(value) or value <= 0:
                raise ValueError(f"Accelerator {self.name!r}: {field} must be a positive number, got {value!r}")


ACCELERATORS: dict[str, Accelerator] = {
    "h100": Accelerator("H100 SXM", 989e12, 3.35e12, 80e9),
    "h200": Accelerator("H200 SXM", 989e12, 4.8e12, 141e9),
    "a100": Accelerator("A100 SXM 80GB", 312e12, 2.039e12, 80e9),
    "v5e": Accelerator("TPU v5e", 197e12, 819e9, 16 * GIB),
    "v5p": Accelerator("TPU v5p", 459e12, 2765e9, 95 * GIB),
}


def register_accelerator(key: str, spec: Accelerator) -> Accelerator:
    """Add (or replace) an accelerator under `key` (lower case)."""
    ACCELERATORS[key.lower()] = spec
    return spec


def accelerator(name: str | Accelerator) -> Accelerator:
    """A known accelerator by key ("h100"), or one given as "name:peak_flops:bandwidth:memory"."""
    if isinstance(name, Accelerator):
        return name
    if ":" in name:
        parts = name.split(":")
        if len(parts) != 4:
            raise ValueError(f"accelerator {name!r}: expected name:peak_flops:bandwidth:memory (4 fields)")
        try:
            peak, bandwidth, memory = (float(p) for p in parts[1:])
        except ValueError:
            raise ValueError(f"accelerator {name!r}: peak_flops, bandwidth and memory must be numbers") from None
        return Accelerator(parts[0], peak, bandwidth, memory)
    key = name.lower()
    if key not in ACCELERATORS:
        raise ValueError(f"accelerator {name!r} is unknown; known: {sorted(ACCELERATORS)} (or name:flops:bw:mem)")
    return ACCELERATORS[key]


def roofline_seconds(flops: Mapping[str, float], hbm_bytes: Mapping[str, float], device: Accelerator) -> dict:
    """{piece: max(flops/peak, bytes/bandwidth)} for the pieces in `flops`, plus "step" (the sum)."""
    times = {name: max(flops[name] / device.peak_flops, hbm_bytes.get(name, 0) / device.bandwidth)
             for name in flops if name != "total"}
    times["step"] = sum(times.values())
    return times


def memory_fraction(environ: Mapping[str, str]) -> tuple[float, str]:
    """(share of each device's memory JAX's allocator will use, where that comes from) under
    `environ`: XLA_CLIENT_MEM_FRACTION or its older name XLA_PYTHON_CLIENT_MEM_FRACTION when set
    (preallocated or not, it is the pool's limit), 1.0 with XLA_PYTHON_CLIENT_ALLOCATOR=platform
    (no pool: exact allocations), else JAX's default 0.75. ValueError for a value outside (0, 1]."""
    for name in MEMORY_FRACTION_ENV:
        text = str(environ.get(name, "")).strip()
        if text:
            try:
                value = float(text)
            except ValueError:
                raise ValueError(f"{name}={text!r} must be a number in (0, 1]") from None
            if not 0 < value <= 1:
                raise ValueError(f"{name}={text!r} must be a number in (0, 1]")
            return value, f"{name}={text}"
    if str(environ.get(ALLOCATOR_ENV, "")).strip().lower() == "platform":
        return 1.0, f"{ALLOCATOR_ENV}=platform"
    preallocate = str(environ.get(PREALLOCATE_ENV, "")).strip()
    also = f", {PREALLOCATE_ENV}={preallocate}" if preallocate else ""
    return DEFAULT_MEMORY_FRACTION, f"{MEMORY_FRACTION_ENV[1]} unset{also}: JAX's default"


def usable_bytes(device: Accelerator, fraction: float | None = None) -> float:
    """The bytes a run may use on one `device`: `fraction` (default: this process's
    `memory_fraction`) of its memory."""
    import os

    return (memory_fraction(os.environ)[0] if fraction is None else fraction) * device.memory


def fits(peak_bytes: float, device: Accelerator, fraction: float | None = None) -> bool:
    """Whether `peak_bytes` per device fits `usable_bytes(device, fraction)`."""
    return peak_bytes <= usable_bytes(device, fraction)


def _divisors(n: int) -> list[int]:
    return [d for d in range(1, n + 1) if n % d == 0]


def layouts(shape: RunShape, num_devices: int) -> list[RunShape]:
    """Every (cand, data, model) factorisation of `num_devices` (cand dividing K, data dividing
    the N rollouts) and chunk size for `shape`, least model parallelism first, then the largest
    chunk (most candidates at once), then the least data parallelism."""
    out = []
    for model in _divisors(num_devices):
        rest = num_devices // model
        for data in _divisors(rest):
            cand = rest // data
            if shape.rollouts % data or shape.num_candidates % cand:
                continue
            for chunk in sorted(_divisors(shape.num_candidates), reverse=True):
                out.append(shape.replace(mesh=(cand, data, model),
                                         chunk_size=0 if chunk == shape.num_candidates else chunk))
    return sorted(out, key=lambda s: (s.mesh[2], -(s.chunk_size or s.num_candidates), s.mesh[1]))


def _first_fit(shape: RunShape, count: int, device: Accelerator, fraction: float | None) -> dict | None:
    for option in layouts(shape, count):
        peak = analytic.peak_bytes_estimate(option)
        if fits(peak, device, fraction):
            return {"devices": count, "mesh": list(option.mesh), "chunk_size": option.chunk_size,
                    "minibatches": option.minibatches, "peak_bytes": peak}
    return None


def suggest(shape: RunShape, device: Accelerator, max_devices: int = 1024,
            fraction: float | None = None) -> dict | None:
    """What would fit, by the analytic peak: the first layout (see `layouts`) on shape's device
    count; else, on that count, the fewest doublings of the minibatch count (smaller update
    batches, same rollouts); else the smallest power-of-two device count up to `max_devices`
    with a layout that fits (`fits` with `fraction`). None when nothing does."""
    choice = _first_fit(shape, shape.num_devices, device, fraction)
    minibatches = shape.minibatches * 2
    while choice is None and shape.update_rows % minibatches == 0:
        choice = _first_fit(shape.replace(minibatches=minibatches), shape.num_devices, device, fraction)
        minibatches *= 2
    count = 1 << shape.num_devices.bit_length()
    while choice is None and count <= max_devices:
        choice = _first_fit(shape, count, device, fraction)
        count *= 2
    return choice
