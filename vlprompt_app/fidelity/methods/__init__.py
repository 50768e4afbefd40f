"""The methods tools/official_equivalence.py runs side by side with their official code, one module each.

A method module defines ``SPECS``, {method name: spec}; a spec is a dict with

* ``repository``: the official GitHub repository (owner/name); ``code_dir``: the folder of its code
  inside it ("" = the root); ``dassl_dir`` (optional): the folder of its own Dassl fork, for
  repositories that hold one (else ``--dassl-git`` names a Dassl clone); ``archive_exclude``
  (optional): paths left out of the exported tree (e.g. large data files a clone may lack);
* ``official_module``: the module defining ``load_clip_to_cpu`` and ``CustomCLIP``;
  ``official_cfg``: {dotted Dassl config node: its values}; ``dataset`` (optional): the
  ``DATASET.NAME`` the official code reads templates by; ``labels`` (optional): the batch's labels
  (default 0, 1, ... modulo the classes);
* ``our_node``: our trainer's config node; ``learnables``: {our parameter name: {"official": the
  official parameter name, "shape": dims (ints, or the symbols ``n_ctx``, ``width``,
  ``vision_width``, ``embed``, ``classes``; default (n_ctx, width)), "init_std", optional
  "init_mean"}}: every value is drawn at ``LEARNABLE_SCALE`` times init_std around init_mean;
  ``official_learnable_prefixes`` (optional, default prompt_learner./adapter_learner.): the
  official parameters under these prefixes must be exactly the mapped ones (or, instead,
  ``official_learnable(name) -> bool`` says which are), less ``official_unused`` (optional),
  those the official model builds but never reads; an entry's optional "fp16": True draws an
  fp16-representable value (for official code that casts the value to fp16); a value is copied
  into an official parameter of the same number of elements but another shape (e.g. a Linear's
  weight into a 1x1 convolution's) with ``view_as``;
* ``outputs``: the names compared; ``batch`` (optional): the number of images (default 2; a
  test-time method's views);
* ``build_ours(clip, tokenizer, classnames, node, spec)`` -> our model (CLIPRunner, Tokenizer,
  class names [C], our config node with any test changes); ``run_ours(model, node, images [B, 3,
  R, R], labels [B])`` -> {output name: tensor};
* on the official side (run in the subprocess, the official tree on ``PYTHONPATH``):
  ``prepare_official(cfg, weights_path)`` (optional; before the official module is imported; the
  working folder is the harness's temporary folder), ``build_official(module, cfg, classnames,
  clip_model)`` (optional; -> the official model, default ``module.CustomCLIP`` in fp32 and eval) and
  ``run_official(module, cfg, request, model, images, labels)`` -> {output name: tensor};
  ``prepare_official_model(model)`` (optional): what the official model needs once built to run
  on the CPU in fp32 (``run_official`` calls it itself).

Official code that does not run on Dassl (e.g. FLYP's) gives instead ``official_side(request,
weights_path, inputs)`` -> {output name: tensor}, run in the subprocess with the official tree on
``PYTHONPATH`` and the stand-ins installed (``request``: method, backbone, classnames, seeds, batch;
``inputs``: {"learnables", "images", "labels"}); it then needs no ``official_module``,
``official_cfg`` values, ``run_official`` or Dassl clone.

For ``tools/benchmark.py official`` (tools/official_benchmark.py), which times one training step
of each side:

* ``official_trainer``: the official trainer class in ``official_module``, whose own
  ``build_model`` and ``forward_backward`` are run; ``official_train_cfg`` (optional): {dotted
  Dassl config key: value (a dict: a new node)} that the official train.py adds and that
  build_model or forward_backward reads;
* (optional) what the official recipe's training step needs beyond ``forward_backward`` of a
  loader's batch: ``official_before_build(module, cfg)`` (before build_model: files it reads,
  loaders to cast), ``official_after_build(trainer)`` (what the official ``before_train`` sets
  up), ``official_step(trainer, batch)`` (the step, when it is more than ``forward_backward``,
  e.g. a per-epoch cache pass that costs one pass per image); ``our_prepare(workdir, image
  size)`` (files our trainer reads, written into the benchmark's working folder, which is the
  official side's working folder too; returns more KEY VALUE config options) and
  ``our_after_build(trainer)`` (e.g. a value both sides must share): the same for our trainer;
  ``plain_design`` (optional): the design dict under which the official clip package's
  ``build_model`` gives the unprompted CLIP timed as the official frozen unit (for packages whose
  build_model takes one and rejects the default trainer name "CoOp", e.g. IVLP-derived ones);
* official code without a Dassl trainer class to build (or a test-time method, whose unit is one
  image's episode): ``official_step_side(request, weights_path, inputs)`` instead of
  ``official_trainer``, run in the subprocess with the stand-ins installed (``request``: method,
  backbone, classnames; ``inputs``: {"images", "labels"}, the batch or the views) -> (the official
  recipe's step, a zero-argument callable; its optimizer); ``views`` (a test-time method): the
  views of one test image its episode adapts on; ``dassl`` (optional, default True): False for
  official code that runs without Dassl (no ``--dassl-git``); a spec made only for the timing (its
  outputs are compared by another tool) has no ``outputs`` and names that tool in ``compared_by``;
* ``benchmark_case`` (optional, default the method's name): our case in
  vlprompt_app/benchmarking/trainer_cases.py (the trainer and its config file); ``our_nodes``
  (optional, default {"TRAINER.<the case's trainer in capitals>": ``our_node``}): {our config
  node: values} set over that config, so that both sides train the model the fixture compares.
"""
from . import (
    atprompt, coop, dept, flyp, maple, mma, mmrl, prograd, promptalign, promptkd, provp, skip_tuning, tac, tcp, tpt,
    wiseft,
)

METHODS = {name: spec
           for module in (coop, prograd, tcp, mma, mmrl, maple, dept, provp, promptkd, atprompt, skip_tuning, tac,
                          flyp, tpt, promptalign, wiseft)
           for name, spec in module.SPECS.items()}
