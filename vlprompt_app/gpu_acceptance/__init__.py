"""The GPU acceptance run: one prepared command that proves, on a lent CUDA GPU, what the CPU
cannot (``tools/gpu_acceptance.py``; PERFORMANCE.md gives the commands and the figures).

* :mod:`.prepare`: here, with a registry and the official clones: the wheels of the packages the
  GPU machine lacks and the exported official trees, into one folder that travels with the tree.
* :mod:`.run`: there: the stages within a time budget, then the report (:mod:`.report`).
* :mod:`.stages`: the stages that run project code (environment, parity, trainers).
* :mod:`.parity`: CUDA against CPU outputs of every benchmark case on the tiny CLIP.
"""
