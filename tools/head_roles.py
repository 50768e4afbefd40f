"""Discover the head roles of a CLIP image tower (DeAR's role map) for any ViT backbone.

The command line of :mod:`vlprompt_app.commands.head_roles` (``--help`` lists its options).
"""
import sys

from vlprompt_app.commands.head_roles import run

if __name__ == "__main__":
    sys.exit(run())
