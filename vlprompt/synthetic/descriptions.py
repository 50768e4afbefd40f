"""Per-class descriptions of the synthetic sets, written from the world's attributes.

Methods that read LLM-written class descriptions (TAC) get, on the synthetic benchmark, the
sentences a describer that knows the world would write: every class is described by the
attributes it fixes (e.g. colour and shape) combined with the other attributes of the world
(sizes, locations, backgrounds and the free one of colour / texture), in the caption
generator's phrasings. :func:`class_descriptions` gives them in the upstream per-dataset format,
``{class name: [sentence, ...]}``; the same class always gets the same sentences.
"""
from .captions import BACKGROUND_WORDS, LOCATION_PHRASES, TEXTURE_PHRASES
from .world import COLORS, LOCATIONS, SIZES, TEXTURES

__all__ = ["describe_class", "class_descriptions"]


def _with_article(phrase):
    return ("an " if phrase[0] in "aeiou" else "a ") + phrase


def describe_class(synth_class):
    """The descriptions of one SynthClass (its name and the attributes it fixes).

    Returns:
        list of str: "a photo of a red star.", one sentence per size ("a huge red star."),
        per location, per background, per value of the attribute the class leaves free
        (texture for colour classes, colour for texture classes) and the predicative form
        ("a star that is red.").
    """
    name, fixed = synth_class.name, synth_class.attributes
    sentences = [f"a photo of {_with_article(name)}."]
    sentences += [f"{_with_article(f'{size} {name}')}." for size in SIZES]
    sentences += [f"{_with_article(name)} {LOCATION_PHRASES[location][0]}." for location in LOCATIONS]
    sentences += [f"{_with_article(name)} on a {word} background." for word in BACKGROUND_WORDS.values()]
    if "texture" not in fixed:
        sentences += [f"{_with_article(name)} {TEXTURE_PHRASES[texture]}." for texture in TEXTURES]
    if "color" not in fixed:
        sentences += [f"{_with_article(f'{color} {name}')}." for color in COLORS]
    qualities = [value for key, value in fixed.items() if key != "shape"]
    if "shape" in fixed and qualities:
        sentences.append(f"{_with_article(fixed['shape'])} that is {' and '.join(qualities)}.")
    return sentences


def class_descriptions(spec):
    """``{class name: describe_class(class)}`` for every class of a SetSpec, in label order."""
    return {synth_class.name: describe_class(synth_class) for synth_class in spec.classes}
