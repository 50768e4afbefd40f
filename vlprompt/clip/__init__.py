"""CLIP loading, tokenization, templates and the prompted runner."""
from .open_clip_import import defer_transformers

defer_transformers()  # before anything below imports open_clip
from .loading import OPENAI_MODELS, BackboneConfig, CLIPLoadError, backbone_config, load_clip, resolve_model_name
from .tokenizer_files import check_tokenizer, get_tokenizer_for
from .runner import (
    CLIPRunner, InsertTokens, MapTokens, Plan, ReplaceTokens, RunState, SharedPrefix, TextTower, TokenLayout,
    TowerOutput, UnsupportedBackboneError, VisionTower,
)
from .templates import DEFAULT_TEMPLATE, IMAGENET_TEMPLATES_SELECT, fill_template, imagenet_templates
from .tokenizer import PromptTooLongError, Tokenizer
from .prompts import CLASS_TOKEN_POSITIONS, TextContext
from .model import PromptedCLIP
from .deep_prompts import (
    MAX_WORD_INIT, check_context_init, check_prompt_depth, check_prompt_sizes, prompt_parameters,
    read_reference_checkpoints, text_prompt_plan, tower_depths, vision_prompt_plan,
)
