"""Measure what each deep attention head of the tiny synthetic CLIP encodes, and derive its role map.

The command line of :mod:`vlprompt_app.commands.synthetic_head_roles` (``--help`` lists its options).
"""
import sys

from vlprompt_app.commands.synthetic_head_roles import main

if __name__ == "__main__":
    sys.exit(main())
