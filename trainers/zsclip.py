"""Zero-shot CLIP (CoOp repository names ``ZeroshotCLIP`` and ``ZeroshotCLIP2``).

Nothing is learned: class text features from hand-crafted sentences are the classifier,
logits = 100 * cos(image, class text). ``ZeroshotCLIP`` uses the dataset's template
(``template`` attribute of the dataset class); ``ZeroshotCLIP2`` averages the normalised
features of CLIP's seven selected ImageNet templates plus the dataset's template (not
for ImageNet), then re-normalises. Both run with ``--eval-only``.
"""
from vlprompt.clip import IMAGENET_TEMPLATES_SELECT
from vlprompt.engine import TRAINER_REGISTRY, ClipTrainer
from vlprompt.engine.benchmark_case import EVAL_ONLY, Case
from vlprompt.methods.template_head import TemplateCLIP


@TRAINER_REGISTRY.register()
class ZeroshotCLIP(ClipTrainer):
    """Zero-shot CLIP with the dataset's hand-crafted template."""

    benchmark_cases = (Case("CoOp/vit_b16.yaml", EVAL_ONLY),)

    learns = False
    exports_class_text_features = True

    frozen_image_encoder = True  # FEATURE_CACHE.ENABLED True caches the test images' features

    def templates(self):
        return [self.dataset_template()]

    def build_model(self):
        clip, tokenizer = self.build_clip()
        self.model = TemplateCLIP(clip, tokenizer, self.classnames, self.templates()).to(self.device).eval()

    def train(self):
        raise RuntimeError(
            f"{type(self).__name__} learns nothing; run it with --eval-only (no --model-dir needed)."
        )


@TRAINER_REGISTRY.register()
class ZeroshotCLIP2(ZeroshotCLIP):
    """Zero-shot CLIP with the prompt ensemble of CLIP's selected ImageNet templates."""

    benchmark_cases = (Case("CoOp/vit_b16.yaml", EVAL_ONLY),)

    def templates(self):
        templates = list(IMAGENET_TEMPLATES_SELECT)
        if self.cfg.DATASET.NAME != "ImageNet":
            templates.append(self.dataset_template())
        return templates
