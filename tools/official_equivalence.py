"""Compare a trainer's model with its official implementation on the same random weights and record
its fixture (tests/fixtures/official/<method>.json); the harness is vlprompt_app.fidelity.

Usage (clones, or bare git directories, of the official repositories; HEAD is compared):

    python tools/official_equivalence.py CoOp --official-git CoOp --dassl-git Dassl.pytorch
    python tools/official_equivalence.py ProGrad --official-git Prompt-align
    python tools/official_equivalence.py MaPLe --official-git DePT --dassl-git Dassl.pytorch
    python tools/official_equivalence.py DePT-MaPLe --official-git DePT --dassl-git Dassl.pytorch
    python tools/official_equivalence.py DePT-CoOp --official-git DePT --dassl-git Dassl.pytorch
    python tools/official_equivalence.py TCP --official-git Textual-based_Class-aware_prompt_tuning \\
        --dassl-git Dassl.pytorch
    python tools/official_equivalence.py MMA --official-git Multi-Modal-Adapter --dassl-git Dassl.pytorch
    python tools/official_equivalence.py MMA-scale0.1 --official-git Multi-Modal-Adapter --dassl-git Dassl.pytorch
    python tools/official_equivalence.py ProVP --official-git ProVP
    python tools/official_equivalence.py MMRL --official-git MMRL --dassl-git Dassl.pytorch
    python tools/official_equivalence.py MMRLpp --official-git MMRL --dassl-git Dassl.pytorch
    python tools/official_equivalence.py PromptKD --official-git PromptKD
    python tools/official_equivalence.py ATPrompt --official-git ATPrompt
    python tools/official_equivalence.py ATPrompt-MaPLe --official-git ATPrompt
    python tools/official_equivalence.py SkipTuning --official-git SkipTuning --dassl-git Dassl.pytorch
    python tools/official_equivalence.py TAC --official-git TAC --dassl-git Dassl.pytorch
    python tools/official_equivalence.py FLYP --official-git FLYP
    python tools/official_equivalence.py WiSEFT --official-git wise-ft
    python tools/official_equivalence.py TPT --official-git TPT --dassl-git Dassl.pytorch
    python tools/official_equivalence.py TPT-CoCoOp --official-git TPT --dassl-git Dassl.pytorch
    python tools/official_equivalence.py PromptAlign --official-git PromptAlign --dassl-git Dassl.pytorch
"""
import sys

from vlprompt_app.fidelity.cli import main

if __name__ == "__main__":
    sys.exit(main())
