"""Caption generator of the synthetic world: sentences that describe a Scene.

A caption mentions a random subset of the scene's attributes, in one of several
paraphrases ("a photo of a small red striped star in the top left", "a star that is
red", "a red shape with stripes on a noisy background"). Which attributes it mentions
is returned with it, so a contrastive loss can count the caption as correct for every
image whose scene has those values (:func:`describes`).

Attributes are mentioned with the probabilities of :data:`MENTION_PROB`; a caption that
names exactly colour and shape (the wording of the downstream class names) is rare
(about 3 % of captions), so downstream prompts have something to learn.
"""
import numpy as np

from .world import ATTRIBUTES, BACKGROUNDS, COLORS, LOCATIONS, SHAPES, SIZES, TEXTURES

__all__ = ["MENTION_PROB", "caption", "describes", "attribute_ids"]

MENTION_PROB = {"shape": 0.75, "color": 0.75, "texture": 0.6, "location": 0.5, "size": 0.5, "background": 0.4}
PREFIXES = ("a photo of", "a picture of", "an image of", "a drawing of", "there is", "")
NOUNS = ("shape", "object", "thing", "figure")
TEXTURE_PHRASES = {
    "solid": "in a single solid color",
    "striped": "with stripes",
    "dotted": "with dots",
    "checkered": "with a checkered pattern",
}
LOCATION_PHRASES = {
    "center": ("in the center", "in the middle"),
    "top left": ("in the top left", "in the top left corner"),
    "top right": ("in the top right", "in the top right corner"),
    "bottom left": ("in the bottom left", "in the bottom left corner"),
    "bottom right": ("in the bottom right", "in the bottom right corner"),
}
BACKGROUND_WORDS = {"plain": "plain", "noise": "noisy", "gradient": "gradient", "clutter": "cluttered"}


def _article(word):
    return "an" if word[0] in "aeiou" else "a"


def caption(scene, rng):
    """A random caption of ``scene``.

    Args:
        scene: Scene (its background must be a pretraining background).
        rng: numpy Generator.

    Returns:
        (text, mentioned): the sentence and the tuple of attribute names it states.
    """
    mentioned = [a for a in ATTRIBUTES if rng.random() < MENTION_PROB[a]]
    if not mentioned:
        mentioned = [ATTRIBUTES[int(rng.integers(len(ATTRIBUTES)))]]
    says = set(mentioned)

    def pick(options):
        return options[int(rng.integers(len(options)))]

    noun = scene.shape if "shape" in says else pick(NOUNS)
    texture_as_phrase = "texture" in says and rng.random() < 0.4
    adjectives = [getattr(scene, a) for a in ("size", "color") if a in says]
    if "texture" in says and not texture_as_phrase:
        adjectives.append(scene.texture)

    form = rng.random()
    if form < 0.2 and "color" in says:
        # "a star that is red and striped"
        predicate = [w for w in adjectives if w != scene.size]
        head = [scene.size] if scene.size in adjectives else []
        phrase = " ".join(head + [noun]) + " that is " + " and ".join(predicate)
    else:
        phrase = " ".join(adjectives + [noun])
    words = [_article(phrase) + " " + phrase]
    if texture_as_phrase:
        words.append(TEXTURE_PHRASES[scene.texture])
    if "location" in says:
        words.append(pick(LOCATION_PHRASES[scene.location]))
    if "background" in says:
        words.append(f"on a {BACKGROUND_WORDS[scene.background]} background")
    prefix = pick(PREFIXES)
    text = " ".join(([prefix] if prefix else []) + words)
    return text, tuple(a for a in ATTRIBUTES if a in says)


_VOCABS = {
    "shape": SHAPES,
    "color": tuple(COLORS),
    "texture": TEXTURES,
    "location": tuple(LOCATIONS),
    "size": tuple(SIZES),
    "background": BACKGROUNDS,
}


def attribute_ids(scenes):
    """Integer attribute values [N, len(ATTRIBUTES)] of a list of scenes."""
    return np.array([[_VOCABS[a].index(getattr(s, a)) for a in ATTRIBUTES] for s in scenes], dtype=np.int64)


def describes(image_ids, caption_ids, mentioned):
    """Which captions are true of which images.

    Args:
        image_ids: [N, A] attribute values of the images (``attribute_ids``).
        caption_ids: [M, A] attribute values of the scenes the captions were written for.
        mentioned: [M, A] bool, the attributes each caption states.

    Returns:
        [N, M] bool: caption j is true of image i (every attribute it states matches).
    """
    equal = image_ids[:, None, :] == caption_ids[None, :, :]
    return np.all(equal | ~mentioned[None, :, :], axis=-1)
