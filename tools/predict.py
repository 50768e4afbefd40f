"""Predict classes of images with a trained run (one row per image).

The command line of :mod:`vlprompt_app.commands.predict` (``--help`` lists its options).
"""
import sys

from vlprompt_app.commands.predict import main

if __name__ == "__main__":
    sys.exit(main())
