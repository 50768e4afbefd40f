"""CLIP-Adapter (Gao et al., IJCV 2024): residual bottleneck MLPs on CLIP's output features.

Both encoders stay frozen. A small MLP A (D -> D/r -> D, ReLU after each layer, no biases)
adapts the image feature and is blended with it, f' = (1 - a) f + a A(f) (residual ratio
a = 0.2 in the paper); the class text features can get their own adapter the same way
(TEXT_RATIO; 0 = none, CLIP-Adapter's best setting and the RAda repository's default).
logits = tau * cos(f', t'); loss = cross-entropy. The image encoder is frozen, so the
configs train on cached image features.

The adapters and the model (``CLIPAdapterCLIP``) are the feature-adapter family
(vlprompt/methods/feature_adapters.py), which RAdaAdapter extends.
"""
from yacs.config import CfgNode as CN

from vlprompt.clip.templates import DEFAULT_TEMPLATE, check_template
from vlprompt.config import register_cfg_extension
from vlprompt.engine import TRAINER_REGISTRY, ClipTrainer
from vlprompt.engine.benchmark_case import CACHED, Case
from vlprompt.methods.feature_adapters import CLIPAdapterCLIP, add_adapter_keys, check_adapter_node


@register_cfg_extension
def add_clip_adapter_config(cfg):
    cfg.TRAINER.CLIPADAPTER = CN()
    cfg.TRAINER.CLIPADAPTER.PREC = "fp16"
    cfg.TRAINER.CLIPADAPTER.TEMPLATE = DEFAULT_TEMPLATE  # "" = the dataset's own template
    add_adapter_keys(cfg.TRAINER.CLIPADAPTER, image_ratio=0.2, text_ratio=0.0, zero_init=False)


@TRAINER_REGISTRY.register()
class CLIPAdapter(ClipTrainer):
    """CLIP-Adapter; the checkpointed module holds the adapters."""

    benchmark_cases = (Case("CLIPAdapter/vit_b16.yaml", CACHED),)

    frozen_image_encoder = True

    def check_cfg(self, cfg):
        node = cfg.TRAINER.CLIPADAPTER
        check_template(node.TEMPLATE, "TRAINER.CLIPADAPTER.TEMPLATE")
        check_adapter_node(node, "TRAINER.CLIPADAPTER")

    def build_model(self):
        node = self.cfg.TRAINER.CLIPADAPTER
        clip, tokenizer = self.build_clip()
        templates = [self.dataset_template(node.TEMPLATE)]
        self.model = CLIPAdapterCLIP(clip, tokenizer, self.classnames, templates, node).to(self.device).eval()
        self.register_learner("adapter", self.model.adapters)
