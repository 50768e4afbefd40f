"""Write the toy setup used by the README's smoke run and the tests.

The command line of :mod:`vlprompt_app.commands.make_toy_setup` (``--help`` lists its options).
"""
import sys

from vlprompt_app.commands.make_toy_setup import main

if __name__ == "__main__":
    sys.exit(main())
