"""Run an evaluation protocol over methods x datasets x seeds with train.py.

The command line of :mod:`vlprompt_app.commands.run_protocol` (``--help`` lists its options).
"""
import sys

from vlprompt_app.commands.run_protocol import main

if __name__ == "__main__":
    sys.exit(main())
