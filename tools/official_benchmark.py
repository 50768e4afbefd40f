"""One training step of our trainers and of their official code, side by side (vlprompt_app.fidelity.cost):
the ``official`` family of tools/benchmark.py on its own, with the same options.

Usage:

    python tools/official_benchmark.py --clock cpu --official-git KaiyangZhou/CoOp=CoOp ... --dassl-git Dassl.pytorch
"""
import sys

from vlprompt_app.fidelity.cli import benchmark_main

if __name__ == "__main__":
    sys.exit(benchmark_main())
