"""FLOP counts of benchmark calls and the device's matrix-product peak, measured in the same process.

FLOPs are counted by ``torch.utils.flop_counter.FlopCounterMode``: matrix products (mm, addmm,
bmm, baddbmm), convolutions and attention, forward and backward, each as 2 FLOPs per
multiply-add (a product [M, K] @ [K, N] counts 2 * M * N * K). Elementwise work (activations,
LayerNorm, softmax, losses, optimizer updates) is not counted. While counting, attention runs
through the math kernel, whose products the counter sees on every device (the CPU's fused
attention kernel has no FLOP formula).

The peak is what the device achieves on the work the counter counts: the best of ``repeats``
timed products of two random [size, size] matrices in the step's dtype (after one untimed
product), on both clocks of :mod:`vlprompt_app.benchmarking.measure` (on CUDA each reading
follows a synchronisation). A call's fraction of the peak is (its FLOPs / its time) / the peak,
both on the same clock: under ``--clock cpu`` FLOPs per CPU-second, so on a CPU shared with
other jobs the fraction measures how well the busy threads use their cores.
"""
import contextlib
from typing import Callable, Dict

import torch

from vlprompt_app.benchmarking.measure import CLOCKS, clocks


@contextlib.contextmanager
def counting_flops():
    """A ``FlopCounterMode`` (``get_total_flops()`` reads the count so far) with attention on the
    math kernel."""
    from torch.nn.attention import SDPBackend, sdpa_kernel
    from torch.utils.flop_counter import FlopCounterMode

    with FlopCounterMode(display=False) as counter, sdpa_kernel(SDPBackend.MATH):
        yield counter


def count_flops(cases: Dict[str, Callable[[], object]]) -> Dict[str, int]:
    """{name: FLOPs of one call of ``cases[name]``} (see the module docstring for what counts)."""
    flops = {}
    for name, fn in cases.items():
        with counting_flops() as counter:
            fn()
        flops[name] = counter.get_total_flops()
    return flops


def matmul_peak(device: torch.device, dtype: torch.dtype, size: int = 2048, repeats: int = 5) -> dict:
    """The device's measured peak on square matrix products.

    Args:
        device: where the product runs (the benchmark's device).
        dtype: the step's dtype (float32, or the autocast dtype of a mixed-precision step).
        size: the matrices are [size, size].
        repeats: timed products; the best of them (each clock separately) gives the peak.

    Returns:
        {"size", "repeats", "dtype" (e.g. "float32"), "flops" (2 * size**3 per product),
        "best_s": {clock: s}, "flops_per_s": {clock: flops / best_s[clock]}} for the clocks
        "wall" and "cpu".
    """
    generator = torch.Generator().manual_seed(0)
    a = torch.randn(size, size, generator=generator).to(device=device, dtype=dtype)
    b = torch.randn(size, size, generator=generator).to(device=device, dtype=dtype)
    out = torch.empty(size, size, device=device, dtype=dtype)
    torch.mm(a, b, out=out)  # untimed: kernel selection, first-touch of the output
    best = {clock: float("inf") for clock in CLOCKS}
    for _ in range(repeats):
        start = clocks(device)
        torch.mm(a, b, out=out)
        end = clocks(device)
        for index, clock in enumerate(CLOCKS):
            best[clock] = min(best[clock], end[index] - start[index])
    flops = 2 * size ** 3
    return {"size": size, "repeats": repeats, "dtype": str(dtype).replace("torch.", ""), "flops": flops,
            "best_s": best, "flops_per_s": {clock: flops / seconds for clock, seconds in best.items()}}
