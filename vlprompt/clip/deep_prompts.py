"""Deep prompts: learnable tokens at the input of the first J layers of a CLIP tower.

Shared by VPT, IVLP (and its language-only variant), MaPLe and PromptSRC. The depth J counts
the layers whose input holds prompts, layer 1 included; layers after J carry the outputs of
the layer-J prompt positions forward.

* Vision: V_1 [n, D] is appended after the class and patch tokens, after the positional
  embedding and before ``ln_pre`` (prompts get no positional embedding); V_k (k = 2..J)
  overwrite the last n tokens at the input of layer k (block index k-1).
* Text: the layer-1 prompts are the context of :class:`~vlprompt.clip.TextContext`
  (positions 1..n of the input embeddings, which do get the positional embedding);
  T_k (k = 2..J) overwrite positions 1..n at the input of layer k.

Also here: the checks of prompt sizes and depths against the backbone (for trainers'
``check_cfg``), and reading checkpoints of the reference implementations, which save the
whole CLIP model with the deep prompts under other names.
"""
import functools
import re

import torch
from torch import nn

from vlprompt.config import ConfigError, check_range

from .families import describe_backbone
from .loading import resolve_model_name
from .runner import EMPTY_PLAN, InsertTokens, Plan, ReplaceTokens
from .tokenizer import Tokenizer

__all__ = [
    "prompt_parameters", "vision_prompt_plan", "text_prompt_plan", "tower_depths",
    "check_prompt_depth", "check_prompt_sizes", "check_context_init", "read_reference_checkpoints", "MAX_WORD_INIT",
]

# IVLP, MaPLe and PromptSRC initialise the text context from the init phrase only when
# it has at most this many vectors (otherwise N(0, 0.02) with "X" placeholders).
MAX_WORD_INIT = 4


def prompt_parameters(count, n_tokens, width, std=0.02):
    """``count`` learnable prompt tensors [n_tokens, width], each drawn from N(0, std²)."""
    return nn.ParameterList(
        nn.Parameter(torch.empty(n_tokens, width).normal_(std=std)) for _ in range(count)
    )


def vision_prompt_plan(prompts):
    """Image-tower plan for the prompts of layers 1..J.

    Args:
        prompts: J tensors [n, D_v] (J = 0 gives the plain tower).

    Returns:
        Plan: V_1 appended before ``ln_pre``, V_k replacing the last n tokens at the
        input of block k-1.
    """
    if len(prompts) == 0:
        return EMPTY_PLAN
    n = prompts[0].shape[0]
    layers = {index: ReplaceTokens(tokens, at=-n) for index, tokens in enumerate(prompts[1:], start=1)}
    return Plan(embed=[InsertTokens(prompts[0])], layers=layers)


def text_prompt_plan(deep_prompts, start=1):
    """Text-tower plan for the deep prompts of layers 2..J (layer 1 is the TextContext).

    Args:
        deep_prompts: J-1 tensors [n, D_t], overwriting the context's positions start..start+n-1
            at the input of blocks 1..J-1.
        start: the tokenizer's start tokens (``Tokenizer.start_tokens``), where the context begins.
    """
    if len(deep_prompts) == 0:
        return EMPTY_PLAN
    return Plan(layers={index: ReplaceTokens(tokens, at=start) for index, tokens in enumerate(deep_prompts, start=1)})


def tower_depths(backbone_name):
    """Numbers of blocks of a backbone's towers (``describe_backbone``: no weights loaded).

    Returns:
        (vision_layers, text_layers): vision_layers is 0 for an image tower the runner does not
        prompt (a ResNet); (None, None) when open_clip has no config for the name, in which
        case depths are not checked against the backbone.
    """
    import open_clip

    model_name, _ = resolve_model_name(backbone_name)
    if open_clip.get_model_config(model_name) is None:
        return None, None
    info = describe_backbone(backbone_name)
    return info.image_layers, info.text_layers


def check_prompt_depth(key, depth, num_layers, minimum, tower, backbone):
    """ConfigError unless ``minimum <= depth <= num_layers``.

    Args:
        key: the depth's config key, e.g. "TRAINER.IVLP.PROMPT_DEPTH_TEXT".
        depth: its value.
        num_layers: blocks of the tower (from ``tower_depths``; None: unknown, only the
            minimum is checked; 0 for a non-ViT image tower).
        minimum: smallest accepted depth.
        tower: "image" or "text". backbone: MODEL.BACKBONE.NAME (named in the message).
    """
    if num_layers == 0 and (depth > 0 or minimum > 0):
        raise ConfigError(
            f"{key} is {depth}, but the {tower} tower of {backbone} is not a ViT and takes no "
            "prompts: use a ViT CLIP backbone (e.g. ViT-B/16)"
            + (" or set it to 0." if minimum == 0 else ".")
        )
    why = "" if num_layers is None else f"The {tower} tower of {backbone} has {num_layers} layers."
    check_range(key, depth, minimum, num_layers, why)


def check_prompt_sizes(cfg, node_name, text=None, vision=None):
    """ConfigError unless the deep prompts of TRAINER.<node_name> fit MODEL.BACKBONE.NAME.

    Every prompted tower needs a depth within 1..its layers (``check_prompt_depth``)
    and at least one token per layer; the depths are checked first (text, then image),
    then the token counts.

    Args:
        cfg: the whole config.
        node_name: the trainer's node, e.g. "MAPLE".
        text, vision: (depth key, token-count key) in that node for the prompts of the
            text / image tower (the same keys may serve both), or None for a tower
            without deep prompts.
    """
    node, prefix, backbone = cfg.TRAINER[node_name], f"TRAINER.{node_name}", cfg.MODEL.BACKBONE.NAME
    vision_layers, text_layers = tower_depths(backbone)
    towers = [(keys, layers, tower) for keys, layers, tower in ((text, text_layers, "text"), (vision, vision_layers, "image"))
              if keys is not None]
    for (depth_key, _), layers, tower in towers:
        check_prompt_depth(f"{prefix}.{depth_key}", node[depth_key], layers, 1, tower, backbone)
    for count_key in dict.fromkeys(count_key for (_, count_key), _, _ in towers):
        check_range(f"{prefix}.{count_key}", node[count_key], minimum=1)


def check_context_init(n_key, n_ctx, init_key, ctx_init, backbone):
    """ConfigError when an IVLP-family context cannot come from its init phrase.

    With a phrase and n <= MAX_WORD_INIT the context starts from the phrase's first n
    token embeddings and the whole phrase stays in the template, so the phrase needs at
    least n tokens (the reference would silently take end-of-text and padding embeddings
    and cut the class name short). n > MAX_WORD_INIT means random init (no check).

    Args:
        n_key, init_key: config keys of n and of the phrase (named in the message).
        backbone: MODEL.BACKBONE.NAME, whose tokenizer counts the phrase's tokens.
    """
    if not ctx_init or n_ctx > MAX_WORD_INIT:
        return
    available = _phrase_tokens(backbone, ctx_init.replace("_", " ").strip())
    if n_ctx > available:
        raise ConfigError(
            f'{n_key} is {n_ctx}, but {init_key} "{ctx_init}" has only {available} tokens. The '
            f"context is initialised from the first {n_key} tokens of the phrase and the phrase "
            f"stays in the prompt, so it needs at least {n_ctx} tokens: use a longer phrase, a "
            f'smaller {n_key}, or {init_key} "" for random initialisation.'
        )


@functools.lru_cache(maxsize=64)
def _phrase_tokens(backbone, phrase):
    """Number of BPE tokens of ``phrase`` for the backbone's tokenizer (cached: building a
    tokenizer reads its whole vocabulary)."""
    return Tokenizer(backbone).num_tokens(phrase)


# Checkpoints of the MaPLe/PromptSRC repositories hold the whole CLIP model: frozen weights
# under these prefixes (dropped on load) and the deep prompts inside the towers (renamed).
_REFERENCE_FROZEN_PREFIXES = ("image_encoder.", "text_encoder.", "logit_scale", "prompt_learner.ZS_image_encoder.")
_REFERENCE_PROMPT_NAMES = (
    (re.compile(r"image_encoder\.VPT$"), lambda match: "vision_prompts.0"),
    (re.compile(r"image_encoder\.transformer\.resblocks\.(\d+)\.VPT_shallow$"),
     lambda match: f"vision_prompts.{int(match[1])}"),
    (re.compile(r"text_encoder\.transformer\.resblocks\.(\d+)\.VPT_shallow$"),
     lambda match: f"text_prompts.{int(match[1]) - 1}"),
)


def _our_prompt_name(key):
    for pattern, rename in _REFERENCE_PROMPT_NAMES:
        match = pattern.match(key)
        if match:
            return rename(match)
    return None


def read_reference_checkpoints(module):
    """Let ``module.load_state_dict`` read checkpoints written by the reference code.

    Registers a load-state-dict pre-hook on ``module`` (a whole method model, registered
    as in the references): reference deep-prompt names are mapped to ours
    (``image_encoder.VPT`` -> ``vision_prompts.0``,
    ``image_encoder.transformer.resblocks.k.VPT_shallow`` -> ``vision_prompts.k``,
    ``text_encoder.transformer.resblocks.k.VPT_shallow`` -> ``text_prompts.(k-1)``) and
    the frozen CLIP weights the references save are dropped, with one line saying how
    many. Checkpoints written by this project pass unchanged.
    """

    def hook(module, state_dict, prefix, *args):
        dropped = 0
        for key in [key for key in state_dict if key.startswith(prefix)]:
            local = key[len(prefix):]
            ours = _our_prompt_name(local)
            if ours is not None:
                state_dict[prefix + ours] = state_dict.pop(key)
            elif local.startswith(_REFERENCE_FROZEN_PREFIXES):
                del state_dict[key]
                dropped += 1
        if dropped:
            print(f"Checkpoint written by the reference code: skipped its {dropped} frozen CLIP tensors")

    module.register_load_state_dict_pre_hook(hook)
