"""Method family bases: the models and trainer bases that several methods of ``trainers/`` build on.

A method file (``trainers/<method>.py``) imports the library only, never another method file:
what two methods share lives here, one module per family, as the engine's
``vlprompt/engine/fine_tuning.py`` (full fine-tuning) and ``vlprompt/engine/test_time.py``
(test-time adaptation) already are. A method names the family it builds on in its imports, e.g.
``from vlprompt.methods.text_context import CoOpCLIP``. A family's config node (e.g.
``TRAINER.COOP``) is declared with it when other methods read it.

Families (module: what it holds; the method that introduced it; the methods built on it):

* ``template_head``: ``TemplateCLIP``, the classifier of averaged template sentences (zero-shot
  CLIP); CLIP-Adapter, RAda, RAdaTTT.
* ``text_context``: ``CoOpCLIP`` and its node ``TRAINER.COOP``, CoOp's learnable context; CoOp;
  KgCoOp, ProGrad, ATPrompt, DePT, TPT.
* ``coupled_prompts``: ``MaPLeCLIP``, its node ``TRAINER.MAPLE`` and ``check_maple_cfg``, MaPLe's
  text prompts coupled to vision prompts; MaPLe; ATPrompt, DePT, TPT, PromptAlign.
* ``conditional_context``: ``CoCoOpCLIP`` and its node ``TRAINER.COCOOP``, CoCoOp's
  image-conditional context; CoCoOp; TPT.
* ``independent_prompts``: ``IVLPCLIP`` and ``check_vl_prompt_config``, deep prompts learned
  independently in both towers; IVLP; PromptSRC, RAdaPrompt, PromptKD (its teacher).
* ``prompt_aggregation``: ``GaussianPromptAggregation``, the weighted running sum of prompts over
  epochs; PromptSRC; TAC.
* ``zero_shot_head``: ``FineTunedCLIP``, ``ZeroShotHeadTrainer`` and ``add_ft_keys``, CLIP's image
  encoder under the zero-shot head, fine-tuned; FT; LP, LPFT, L2SP, WiSEFT.
* ``prompt_tuning``: ``PromptTuning``, ``PromptTuningTrainer`` and the node ``TRAINER.TPT``,
  TPT's test-time episodes on a prompted CLIP; TPT; PromptAlign.
* ``feature_adapters``: ``CLIPAdapterCLIP``, ``FeatureAdapters`` and their node keys, CLIP-Adapter's
  residual MLPs on the output features; CLIP-Adapter; RAdaAdapter.
* ``rada``, ``rada_rational``, ``rada_mask_generators``: ``RAdaCLIP``, the rational adapter, its
  mask generators and their node keys; RAda; RAdaFFT, RAdaTTT, RAdaPrompt, RAdaAdapter.
* ``representation_tokens``: ``MMRLCLIP``, ``SharedRepresentation``, ``RepresentationTokensTrainer``,
  MMRL's representation space read by both towers; MMRL; MMRL++.
* ``prograd_templates``: ``PROGRAD_TEMPLATES``, ProGrad's sentence template of each dataset;
  ProGrad; ProVP.
"""
