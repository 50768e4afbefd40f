"""PromptAlign's source statistics: token means and variances of a source MaPLe model.

The command line of :mod:`vlprompt_app.commands.promptalign_stats` (``--help`` lists its options).
"""
import sys

from vlprompt_app.commands.promptalign_stats import main

if __name__ == "__main__":
    sys.exit(main())
