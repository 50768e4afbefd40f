"""Pretrain the tiny CLIP of the synthetic benchmark contrastively, on CPU.

The command line of :mod:`vlprompt_app.commands.pretrain_tiny_clip` (``--help`` lists its options).
"""
import sys

from vlprompt_app.commands.pretrain_tiny_clip import main

if __name__ == "__main__":
    sys.exit(main())
