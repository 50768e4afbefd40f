"""Sentence templates shared by the zero-shot and prompt-learning trainers.

Per-dataset hand-crafted templates belong to the dataset classes (``template``
attribute); this module holds only the cross-dataset lists.
"""
import functools

from vlprompt.config import ConfigError

__all__ = [
    "imagenet_templates", "IMAGENET_TEMPLATES_SELECT", "DEFAULT_TEMPLATE", "fill_template", "check_template",
    "dataset_template",
]

@functools.lru_cache(maxsize=None)
def imagenet_templates():
    """CLIP's 80 ImageNet prompt templates, in CLIP's order, as format strings (a tuple; read from
    open_clip when first asked for, so that importing this module does not import open_clip)."""
    from open_clip.zero_shot_metadata import OPENAI_IMAGENET_TEMPLATES

    return tuple(template("{}") for template in OPENAI_IMAGENET_TEMPLATES)


# The seven templates CLIP selected for ImageNet (used by ZeroshotCLIP2).
IMAGENET_TEMPLATES_SELECT = (
    "itap of a {}.",
    "a bad photo of the {}.",
    "a origami {}.",
    "a photo of the large {}.",
    "a {} in a video game.",
    "art of the {}.",
    "a photo of the small {}.",
)

DEFAULT_TEMPLATE = "a photo of a {}."


def fill_template(template, classname):
    """Sentence for one class: underscores of the class name become spaces."""
    return template.format(classname.replace("_", " "))


def check_template(template, key):
    """Raise ConfigError unless ``template`` (config key ``key``) is empty or has exactly one "{}"."""
    if template and template.count("{}") != 1:
        raise ConfigError(f"{key} must contain exactly one '{{}}' for the class name (or be empty), got '{template}'.")


def dataset_template(dataset, template=""):
    """``template`` if given, else the dataset's ``template`` attribute (the class's, or the instance's
    when the dataset reads it from its config, as ImageFolder does), else DEFAULT_TEMPLATE."""
    return template or getattr(dataset, "template", DEFAULT_TEMPLATE)
