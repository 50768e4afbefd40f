"""Check a data folder before launching runs: which of the benchmark datasets are usable.

The command line of :mod:`vlprompt_app.commands.check_datasets` (``--help`` lists its options).
"""
import sys

from vlprompt_app.commands.check_datasets import main

if __name__ == "__main__":
    sys.exit(main())
