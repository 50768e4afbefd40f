"""Write the generic image-description corpus of the head-role tool.

The command line of :mod:`vlprompt_app.commands.make_description_corpus` (``--help`` lists its options).
"""
import sys

from vlprompt_app.commands.make_description_corpus import main

if __name__ == "__main__":
    sys.exit(main())
