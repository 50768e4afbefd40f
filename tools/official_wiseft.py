"""FT's model and WiSE-FT's interpolation side by side with mlfoundations/wise-ft (the WiSEFT method of
vlprompt_app.fidelity; the same as ``tools/official_equivalence.py WiSEFT``).

Usage:

    python tools/official_wiseft.py --official-git /path/to/wise-ft   # a clone or its git directory
"""
import sys

from vlprompt_app.fidelity.cli import wiseft_main

if __name__ == "__main__":
    sys.exit(wiseft_main())
