"""Export a trained run as one classifier file.

The command line of :mod:`vlprompt_app.commands.export` (``--help`` lists its options).
"""
import sys

from vlprompt_app.commands.export import main

if __name__ == "__main__":
    sys.exit(main())
