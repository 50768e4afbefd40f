"""Evaluation protocols: output layout, benchmark definitions, grid expansion and execution.

``tools/run_protocol.py`` is the command line; ``tools/parse_results.py`` reads the same
layout back into tables. Importing this package does not import torch.
"""
from .benchmark import PROTOCOLS, Benchmark, BenchmarkError, ProtocolDatasets, load_benchmark
from .grid import Chain, GridSpec, Method, Run, StageInit, build_grid, resolve_method, resolve_methods
from .layout import RunKey, base2new_run_dir, evaluation_run_dir, fewshot_run_dir, parse_run_path, ttt_run_dir

__all__ = [
    "PROTOCOLS", "Benchmark", "BenchmarkError", "ProtocolDatasets", "load_benchmark",
    "Chain", "GridSpec", "Method", "Run", "StageInit", "build_grid", "resolve_method", "resolve_methods",
    "RunKey", "base2new_run_dir", "evaluation_run_dir", "fewshot_run_dir", "parse_run_path", "ttt_run_dir",
]
