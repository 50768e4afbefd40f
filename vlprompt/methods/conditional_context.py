"""The conditional-context family: CoCoOp's image-conditional text context (CoCoOp, CVPR 2022).

``CoCoOpCLIP`` is frozen CLIP whose context vectors are shifted per image by a meta-net of the image
feature (``ConditionalContext``), the B x C prompts encoded in chunks; its node ``TRAINER.COCOOP``
holds the context's size, init phrase, precision and chunk size. Introduced by CoCoOp
(``trainers/cocoop.py``); TPT tunes its context at test time (TRAINER.TPT.PROMPT "cocoop").
"""
from collections import OrderedDict

import torch
import torch.nn.functional as F
from torch import nn
from torch.utils.checkpoint import checkpoint
from yacs.config import CfgNode as CN

from vlprompt.clip import PromptedCLIP, TextContext
from vlprompt.config import register_cfg_extension

__all__ = ["add_cocoop_config", "ConditionalContext", "CoCoOpCLIP"]


@register_cfg_extension
def add_cocoop_config(cfg):
    cfg.TRAINER.COCOOP = CN()
    cfg.TRAINER.COCOOP.N_CTX = 16  # number of context vectors (ignored when CTX_INIT is set)
    cfg.TRAINER.COCOOP.CTX_INIT = ""  # init phrase, e.g. "a photo of a" (n := its number of words)
    cfg.TRAINER.COCOOP.PREC = "fp16"  # fp16 = autocast with fp32 master weights on CUDA
    cfg.TRAINER.COCOOP.TEXT_CHUNK_SIZE = 256  # max (image, class) prompts per text-encoder call


class ConditionalContext(TextContext):
    """CoOp's context plus the meta-net that shifts it per image.

    Args:
        text_tower, tokenizer, classnames, n_ctx, ctx_init: as TextContext ("coop" mode).
        feature_dim: dimension E of CLIP's image features (input of the meta-net).

    Attributes:
        ctx: Parameter [n, D].
        meta_net: linear1 (E -> E/16), ReLU, linear2 (E/16 -> D).
    """

    def __init__(self, text_tower, tokenizer, classnames, n_ctx, ctx_init, feature_dim):
        super().__init__(text_tower, tokenizer, classnames, n_ctx=n_ctx, ctx_init=ctx_init)
        hidden = feature_dim // 16
        self.meta_net = nn.Sequential(OrderedDict([
            ("linear1", nn.Linear(feature_dim, hidden)),
            ("relu", nn.ReLU(inplace=True)),
            ("linear2", nn.Linear(hidden, text_tower.width)),
        ]))

    def conditioned(self, image_features):
        """Per-image contexts [B, n, D] from normalised image features [B, E]."""
        return self.ctx.unsqueeze(0) + self.meta_net(image_features).unsqueeze(1)

    def pair_embeddings(self, contexts, classes):
        """Prompt embeddings [N, L, D] of N (context, class) pairs.

        Args:
            contexts: [N, n, D], one context per pair.
            classes: [N] class indices.
        """
        contexts = contexts.to(self.token_prefix.dtype)
        return torch.cat([self.token_prefix[classes], contexts, self.token_suffix[classes]], dim=1)


class CoCoOpCLIP(PromptedCLIP):
    """Frozen CLIP with CoCoOp's image-conditional text context.

    Args:
        clip: CLIPRunner. tokenizer: Tokenizer. classnames: C names.
        node: cfg.TRAINER.COCOOP.
    """

    device_caches = PromptedCLIP.device_caches + ("_pair_chunks",)

    def __init__(self, clip, tokenizer, classnames, node):
        super().__init__(clip)
        self.prompt_learner = ConditionalContext(
            clip.text, tokenizer, classnames, n_ctx=node.N_CTX, ctx_init=node.CTX_INIT,
            feature_dim=clip.text.output_dim,  # image and text features share CLIP's embedding
        )
        self.chunk_size = node.TEXT_CHUNK_SIZE
        self._pair_chunks = None

    def forward(self, images):
        image_features = F.normalize(self.clip.encode_image(images), dim=-1)
        contexts = self.prompt_learner.conditioned(image_features)
        return self.logit_scale * self.conditional_similarities(image_features, contexts)

    def pair_chunks(self, num_images, device):
        """(pairs [B·C], [(images [n], classes [n], pooled positions [n]) per chunk]) for B images.

        The B x C (image, class) pairs, indexed image * C + class, class-major from the shortest
        sentence to the longest, cut into chunks of ``chunk_size``. They depend on B and the class
        list only, so they are made once per B (and device, and class list) and the same tensors
        come back: the text tower reads each chunk's longest position from the device once, not at
        every step.
        """
        eot = self.prompt_learner.eot  # a new class list is a new tensor
        if self._pair_chunks is None or self._pair_chunks[0] is not eot:
            self._pair_chunks = (eot, {})
        plans = self._pair_chunks[1]
        key = (num_images, str(device))
        if key not in plans:
            num_classes = self.prompt_learner.num_classes
            first_pair = torch.arange(num_images, device=device) * num_classes
            pairs = (eot.argsort(stable=True).unsqueeze(1) + first_pair).flatten()
            chunks = [(chunk // num_classes, chunk % num_classes, eot[chunk % num_classes])
                      for chunk in pairs.split(self.chunk_size)]
            plans[key] = (pairs, chunks)
        return plans[key]

    def conditional_similarities(self, image_features, contexts):
        """cos(f_b, text(contexts_b, c)) for all images b and classes c: [B, C].

        The B x C prompts are encoded ``chunk_size`` at a time, class by class from the
        shortest sentence to the longest (``pair_chunks``), so that a chunk's text pass (which
        computes positions up to its longest sentence) holds sentences of similar lengths. When
        training needs more than one chunk, each chunk's text pass is recomputed in the
        backward pass instead of being kept (activation checkpointing), so training
        memory is bounded by the chunk too; the gradients are the same.
        """
        num_images, num_classes = image_features.shape[0], self.prompt_learner.num_classes
        pairs, chunks = self.pair_chunks(num_images, image_features.device)
        recompute = torch.is_grad_enabled() and len(chunks) > 1
        similarities = []
        for images, classes, eot in chunks:
            if recompute:
                text = checkpoint(self.encode_pairs, contexts[images], classes, eot, use_reentrant=False)
            else:
                text = self.encode_pairs(contexts[images], classes, eot)
            similarities.append((image_features[images] * F.normalize(text, dim=-1)).sum(dim=-1))
        similarities = torch.cat(similarities)
        return similarities.new_empty(pairs.shape).index_copy(0, pairs, similarities).view(num_images, num_classes)

    def encode_pairs(self, contexts, classes, eot=None):
        """Text features [N, E] of N (context [N, n, D], class [N]) prompts; ``eot``: the classes'
        pooled positions [N] (default: looked up)."""
        prompts = self.prompt_learner
        eot = prompts.eot[classes] if eot is None else eot
        return self.clip.text(embeddings=prompts.pair_embeddings(contexts, classes), eot=eot).features
