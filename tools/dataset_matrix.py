"""Print every dataset's own facts and the method x dataset matrix of per-dataset values.

The command line of :mod:`vlprompt_app.commands.dataset_matrix` (``--help`` lists its options).
"""
import sys

from vlprompt_app.commands.dataset_matrix import main

if __name__ == "__main__":
    sys.exit(main())
