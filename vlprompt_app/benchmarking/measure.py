"""Clocks, interleaved timing rounds and memory readings shared by every benchmark family."""
import os
import statistics
import time
from typing import Callable, Dict, List

import torch

CLOCKS = ("wall", "cpu")


def clocks(device: torch.device):
    """(wall, CPU) clock readings in seconds after ``device`` has finished its queued work.

    CPU time is the process's (all its threads): on a CPU shared with other jobs it does
    not count the time the others take.
    """
    if device.type == "cuda":
        torch.cuda.synchronize()
    return time.perf_counter(), time.process_time()


def time_interleaved(calls: Dict[str, Callable[[], object]], device: torch.device, rounds: int,
                     warmup: int) -> Dict[str, Dict[str, List[float]]]:
    """{name: {"wall": [s, ...], "cpu": [s, ...]}} of ``rounds`` timed rounds after ``warmup``
    untimed ones; a round calls every entry of ``calls`` once, in order (interleaved, so that
    a change of the machine's load hits every call alike)."""
    times = {name: {clock: [] for clock in CLOCKS} for name in calls}
    for round_index in range(warmup + rounds):
        for name, call in calls.items():
            start = clocks(device)
            call()
            end = clocks(device)
            if round_index >= warmup:
                times[name]["wall"].append(end[0] - start[0])
                times[name]["cpu"].append(end[1] - start[1])
    return times


def medians(times: Dict[str, Dict[str, List[float]]]) -> Dict[str, Dict[str, float]]:
    """{name: {clock: median seconds}} of ``time_interleaved``'s output."""
    return {name: {clock: statistics.median(values) for clock, values in entry.items()}
            for name, entry in times.items()}


def peak_memory_mib(device: torch.device) -> float:
    """CUDA max allocated memory, or the process's peak resident set size (VmHWM), in MiB."""
    if device.type == "cuda":
        return torch.cuda.max_memory_allocated() / 2**20
    with open("/proc/self/status") as status:
        line = next(line for line in status if line.startswith("VmHWM:"))
    return int(line.split()[1]) / 1024


def reset_peak_memory(device: torch.device):
    """Start a new peak for ``peak_memory_mib`` (on the CPU: VmHWM back to the current RSS)."""
    if device.type == "cuda":
        torch.cuda.reset_peak_memory_stats()
    else:
        with open("/proc/self/clear_refs", "w") as clear_refs:  # "5" resets VmHWM to the current RSS
            clear_refs.write("5")


def current_rss_mib() -> float:
    """The process's resident set size now, in MiB."""
    with open("/proc/self/statm") as statm:
        return int(statm.read().split()[1]) * os.sysconf("SC_PAGE_SIZE") / 2**20
