"""RAda + Adapter (paper Table 2): CLIP-Adapter's feature adapters and RAda's mask
generator trained jointly on frozen encoders.

The image feature and the class text features pass through residual bottleneck adapters
(:mod:`vlprompt.methods.feature_adapters`), are normalised, and RAda masks their rational matrix;
loss = CE + ALPHA * L_mask. Defaults follow the official code's combination (khufia/RAda,
``eft/trainers/clip_adapter.py``, trainer CLIP_ADAPTER; ``eft/trainers/adapter_mask.py`` has no
mask generator): adapters on both features, second layer zero-initialised, f' = f + A(f)
(ratio 0.5 up to normalisation), so at step 0 the model is zero-shot CLIP; unlike the official
code, the zero-initialised adapter has no ReLU after its last layer, so it can learn (see
``vlprompt.methods.feature_adapters.Adapter``). The official mask loss is MASK_LOSS "mse" with
the global softmax (configs/trainers/RAdaAdapter/vit_b16_base2new.yaml); the paper's L2 and row
softmax are vit_b16_base2new_paper.yaml. The image encoder is frozen: training reads cached features.
"""
from yacs.config import CfgNode as CN

from vlprompt.clip.templates import DEFAULT_TEMPLATE
from vlprompt.config import register_cfg_extension
from vlprompt.engine import TRAINER_REGISTRY, ClipTrainer
from vlprompt.engine.benchmark_case import CACHED, Case
from vlprompt.methods.feature_adapters import CLIPAdapterCLIP, add_adapter_keys, check_adapter_node
from vlprompt.methods.rada import add_generator_keys, add_mask_loss_keys, build_rational_adapter, check_rada_node


@register_cfg_extension
def add_rada_adapter_config(cfg):
    node = cfg.TRAINER.RADAADAPTER = CN()
    node.PREC = "fp16"
    node.TEMPLATE = DEFAULT_TEMPLATE  # class sentence; "" = the dataset's own template
    add_generator_keys(node)
    add_mask_loss_keys(node)
    add_adapter_keys(node, image_ratio=0.5, text_ratio=0.5, zero_init=True)


class RAdaAdapterCLIP(CLIPAdapterCLIP):
    """Frozen CLIP with feature adapters and a mask generator.

    Args:
        clip: CLIPRunner (frozen). tokenizer: Tokenizer. classnames: K names.
        templates: sentence templates. node: cfg.TRAINER.RADAADAPTER.

    Attributes:
        rational: RationalAdapter (logits and loss). mask_generator: its generator.
    """

    def __init__(self, clip, tokenizer, classnames, templates, node):
        super().__init__(clip, tokenizer, classnames, templates, node)
        self.rational = build_rational_adapter(node, clip.text.output_dim)
        self.mask_generator = self.rational.generator

    def forward_features(self, image_features):
        return self.rational(*self.adapters(image_features, self.class_text_features()), self.logit_scale)[0]

    def loss_features(self, image_features, labels):
        return self.rational.loss(*self.adapters(image_features, self.class_text_features()), self.logit_scale, labels)


@TRAINER_REGISTRY.register()
class RAdaAdapter(ClipTrainer):
    """RAda + Adapter; the mask generator and the adapters are checkpointed separately (a RAdaTTT
    run can start from this mask generator)."""

    benchmark_cases = (Case("RAdaAdapter/vit_b16_base2new.yaml", CACHED),)

    frozen_image_encoder = True

    def check_cfg(self, cfg):
        check_rada_node(cfg.TRAINER.RADAADAPTER, "TRAINER.RADAADAPTER")
        check_adapter_node(cfg.TRAINER.RADAADAPTER, "TRAINER.RADAADAPTER")

    def build_model(self):
        node = self.cfg.TRAINER.RADAADAPTER
        clip, tokenizer = self.build_clip()
        templates = [self.dataset_template(node.TEMPLATE)]
        self.model = RAdaAdapterCLIP(clip, tokenizer, self.classnames, templates, node).to(self.device).eval()
        self.register_learner("mask_generator", self.model.mask_generator)
        self.register_learner("adapter", self.model.adapters)
