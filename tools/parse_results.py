"""Aggregate test accuracies of CoOp-family run folders (successor of ``parse_test_res.py``).

The command line of :mod:`vlprompt_app.commands.parse_results` (``--help`` lists its options).
"""
import sys

from vlprompt_app.commands.parse_results import main

if __name__ == "__main__":
    sys.exit(main())
