"""The GPU acceptance run: prepare it here, run it on a lent CUDA GPU in one command.

The command line of :mod:`vlprompt_app.commands.gpu_acceptance` (``--help`` lists its options).
"""
import sys

from vlprompt_app.commands.gpu_acceptance import main

if __name__ == "__main__":
    sys.exit(main())
