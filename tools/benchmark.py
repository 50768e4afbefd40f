"""Cost measurements of the project, one subcommand per family of cases.

The command line of :mod:`vlprompt_app.commands.benchmark` (``--help`` lists its options).
"""
import sys

from vlprompt_app.commands.benchmark import main

if __name__ == "__main__":
    sys.exit(main())
