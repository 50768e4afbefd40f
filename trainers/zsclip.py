"""Zero-shot CLIP (CoOp repository names ``ZeroshotCLIP`` and ``ZeroshotCLIP2``).

Nothing is learned: class text features from hand-crafted sentences are the classifier,
logits = 100 * cos(image, class text). ``ZeroshotCLIP`` uses the dataset's template
(``template`` attribute of the dataset class); ``ZeroshotCLIP2`` averages the normalised
features of CLIP's seven selected ImageNet templates plus the dataset's template (not
for ImageNet), then re-normalises. Both run with ``--eval-only``.
"""
import torch
import torch.nn.functional as F

from vlprompt.clip import IMAGENET_TEMPLATES_SELECT, PromptedCLIP, fill_template
from vlprompt.engine import TRAINER_REGISTRY, ClipTrainer
from vlprompt.engine.benchmark_case import EVAL_ONLY, Case


class TemplateCLIP(PromptedCLIP):
    """Frozen CLIP whose classifier is the mean of normalised template features.

    Args:
        clip: CLIPRunner.
        tokenizer: Tokenizer.
        classnames: C class names.
        templates: format strings with one "{}".
    """

    def __init__(self, clip, tokenizer, classnames, templates):
        super().__init__(clip)
        sentences = [[fill_template(t, name) for name in classnames] for t in templates]
        for group in sentences:
            print(f"Prompts: {group}")
        ids = torch.stack([tokenizer(group) for group in sentences])  # [T, C, L]
        self.register_buffer("token_ids", ids, persistent=False)

    def compute_text_features(self):
        features = [F.normalize(self.clip.encode_text(ids), dim=-1) for ids in self.token_ids]
        return torch.stack(features).mean(dim=0)

    def encode_image_features(self, images):
        """Features [B, E] of the frozen image encoder (not normalised; what FEATURE_CACHE stores)."""
        return self.clip.encode_image(images)

    def forward_features(self, image_features):
        """Logits [B, C] from features of ``encode_image_features``."""
        return self.cosine_logits(F.normalize(image_features, dim=-1), self.class_text_features())

    def forward(self, images):
        return self.forward_features(self.encode_image_features(images))


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
