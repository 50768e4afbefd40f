"""Cost measurements behind ``tools/benchmark.py``, one module per family of cases.

* ``per_trainer``: training step, evaluation, memory and learnable parameters of every
  registered trainer, as cost ratios against a frozen CLIP image forward;
* ``dear``: DeAR's training step with and without its regulariser L_reg, the frozen branch
  alone, and their FLOPs;
* ``cocoop``: peak memory and time of CoCoOp's per-image text passes by chunk size;
* ``feature_cache``: epoch time of a frozen-encoder trainer with and without the feature cache;
* ``loader``: training-loader images/s by worker count.

Every family times with ``measure.clocks`` (wall clock and the process's CPU time, one
``--clock`` chooses which one sets the medians and ratios) and returns its records in the
envelope of ``report`` (settings, commit, machine load, ``results``), which the tool prints
as one table and writes with ``--json``.
"""
