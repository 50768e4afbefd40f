"""Fidelity to the official code: each method's model side by side with its official implementation.

A method is compared on inputs both sides rebuild from seeds (a random CLIP, learnable values drawn
away from their inits, a batch of images), and the official outputs are recorded once, by running
the official repository in a subprocess, into tests/fixtures/official/<method>.json; the tests
rebuild our side and compare it with that fixture. The same specs time one training step of each
side (``tools/benchmark.py official``).

The contract of a method is its ``spec.MethodSpec`` (one module per method under ``methods/``, each
defining ``SPECS``):

* which official tree (repository, code folder, Dassl fork) and module, and how the official side
  is built and run: the Dassl hooks (``official_cfg``, ``prepare_official``, ``build_official``,
  ``run_official``), or ``official_side`` for code without Dassl. The official parameters the method
  learns must be exactly the mapped ones, else recording stops and names the difference;
* how our side is built and run (``build_ours``, ``run_ours``, ``our_node``);
* the learnable values both sides share, ``{our parameter name: Learnable(official name, init std,
  shape, ...)}``: drawn at 10x the official init std, so that a value in the wrong place moves the
  outputs;
* the compared ``outputs`` (relative max difference max|ours - official| / max|official| at most
  ``TOLERANCE``, 3e-3) and ``exact_outputs``;
* its ``mutations``: named misplacements (values swapped or reversed, a component one block off,
  another template or blend weight) each of which must make the named outputs fail the comparison;
* ``cost`` (a ``spec.CostSpec``): how the official step is timed, or None.

Modules: ``spec`` (the contract's types), ``weights`` (the seeded random CLIP), ``harness`` (inputs,
our side built once per fixture with mutations applied to it, recording a fixture), ``kept`` (the
tower runs our side repeats on equal inputs, computed once), ``official_env``
(stand-ins and the Dassl set-up of the official subprocess), ``export`` (the official trees),
``side`` (``python -P -m vlprompt_app.fidelity.side``: the subprocess, run with the official trees
on its PYTHONPATH; nothing here changes sys.path), ``cost`` (the benchmark family) and ``cli`` (the
command lines behind tools/official_equivalence.py, official_wiseft.py and official_benchmark.py).
"""
