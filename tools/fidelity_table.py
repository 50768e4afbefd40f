"""Print the Markdown table of the official-code comparisons from their recorded fixtures.

The command line of :mod:`vlprompt_app.commands.fidelity_table` (``--help`` lists its options).
"""
import sys

from vlprompt_app.commands.fidelity_table import main

if __name__ == "__main__":
    sys.exit(main())
