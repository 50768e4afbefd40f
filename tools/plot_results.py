"""Figures of the protocol runner's outputs (PNG; matplotlib is the optional "plots" extra).

The command line of :mod:`vlprompt_app.commands.plot_results` (``--help`` lists its options).
"""
import sys

from vlprompt_app.commands.plot_results import main

if __name__ == "__main__":
    sys.exit(main())
