"""The GPU acceptance run: one prepared command that proves, on a lent CUDA GPU, what the CPU
cannot (``tools/gpu_acceptance.py``; PERFORMANCE.md gives the commands and the figures).

* :mod:`.prepare`: here, with a registry and the official clones: the wheels of the packages the
  GPU machine lacks and the exported official trees, into one folder that travels with the tree.
* :mod:`.run`: there: the stages in steps with deadlines within a time budget, then the report.
* :mod:`.stages`: the stages that measure project code (environment, parity, official, trainers,
  compiled).
* :mod:`.data`: the real-size data stages (a photo-sized ImageNet-layout tree; a DeAR
  base-to-novel chain from it with the time each step waits for data).
* :mod:`.parity`: CUDA against CPU outputs of every benchmark case.
* :mod:`.checks` and :mod:`.report`: what the run must show, and ``acceptance.json`` / ``acceptance.md``.
"""
