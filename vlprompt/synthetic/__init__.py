"""The synthetic benchmark: a procedural world, its caption generator, the contrastive
pretraining data of the project's tiny CLIP, and the downstream sets.

* ``world``: vocabularies, :class:`~vlprompt.synthetic.world.Scene`, rendering styles and
  the deterministic renderer (32x32 RGB images);
* ``captions``: sentences describing a scene, and which captions are true of which images;
* ``pretraining``: the batch stream, the multi-positive contrastive loss and the
  zero-shot attribute probe used by ``tools/pretrain_tiny_clip.py``;
* ``downstream``: the downstream sets (classes, styles, counts) and their writer into
  ``DATASET.ROOT`` (dataset classes in ``datasets/synthetic.py``).

It is not the real 11-dataset benchmark; it makes every method and protocol runnable
offline on a CPU and checks that methods learn.
"""
