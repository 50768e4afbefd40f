"""Description corpora for TEXTSPAN.

A corpus is a list of short image descriptions, optionally with the concept each was
written for. Files: ``.tsv`` lines ``concept<TAB>description``; any other extension,
one description per line. Empty lines and lines starting with ``#`` are skipped, and a
repeated description is kept once.

Built-in corpora (pass the name instead of a path):

* ``generic``: the project's generic corpus (``data/generic_image_descriptions.tsv``,
  written by ``tools/make_description_corpus.py``): about 2,800 descriptions over
  twelve concepts (location, object, color, shape, texture, animal, human, text,
  number, style, emotion, action), for CLIP models trained on natural images;
* ``synthetic``: descriptions in the synthetic world's vocabulary (one attribute per
  description: shape, color, texture, location, size, background), for the project's
  tiny CLIP pretrained on that world, whose text encoder knows no other words.
"""
import os
from dataclasses import dataclass
from typing import Optional, Tuple

__all__ = ["Corpus", "CorpusError", "load_corpus", "synthetic_world_corpus", "GENERIC_CORPUS_PATH"]

GENERIC_CORPUS_PATH = os.path.join(os.path.dirname(os.path.abspath(__file__)), "data", "generic_image_descriptions.tsv")


class CorpusError(ValueError):
    """A corpus file that cannot be used (the message names the file and line)."""


@dataclass
class Corpus:
    """Descriptions and, when known, their concept labels.

    Attributes:
        texts: M descriptions.
        labels: M concept labels, or None for an unlabelled corpus.
        source: where it came from (file path or built-in name).
    """

    texts: Tuple[str, ...]
    labels: Optional[Tuple[str, ...]]
    source: str

    def __len__(self):
        return len(self.texts)


def load_corpus(name_or_path="generic"):
    """Load a built-in corpus (``generic``, ``synthetic``) or a corpus file."""
    if name_or_path == "generic":
        return _read_file(GENERIC_CORPUS_PATH, source="generic")
    if name_or_path == "synthetic":
        return synthetic_world_corpus()
    if not os.path.isfile(name_or_path):
        raise CorpusError(
            f'Description corpus "{name_or_path}" is neither a built-in corpus (generic, synthetic) '
            "nor an existing file (.tsv with concept<TAB>description lines, or one description per line)."
        )
    return _read_file(name_or_path, source=name_or_path)


def _read_file(path, source):
    labelled = path.endswith(".tsv")
    texts, labels, seen = [], [], set()
    with open(path, "r", encoding="utf-8") as f:
        for number, line in enumerate(f, start=1):
            line = line.rstrip("\n")
            if not line.strip() or line.lstrip().startswith("#"):
                continue
            if labelled:
                label, tab, text = line.partition("\t")
                if not tab or not label.strip() or not text.strip():
                    raise CorpusError(
                        f'{path}, line {number}: expected "concept<TAB>description", got {line!r}.'
                    )
                label = "_".join(label.split())
            else:
                text, label = line, None
            text = " ".join(text.split())
            if text in seen:
                continue
            seen.add(text)
            texts.append(text)
            labels.append(label)
    if not texts:
        raise CorpusError(f"Description corpus {path} holds no description.")
    return Corpus(texts=tuple(texts), labels=tuple(labels) if labelled else None, source=source)


def synthetic_world_corpus():
    """Descriptions of single attributes in the synthetic world's caption vocabulary."""
    from vlprompt.synthetic.captions import BACKGROUND_WORDS, LOCATION_PHRASES, NOUNS, TEXTURE_PHRASES
    from vlprompt.synthetic.world import COLORS, SHAPES, SIZES

    def article(phrase):
        return ("an " if phrase[0] in "aeiou" else "a ") + phrase

    rows = []
    for shape in SHAPES:
        rows += [("shape", f"{prefix} {article(shape)}".strip()) for prefix in ("", "a photo of", "an image of", "a drawing of")]
    for noun in NOUNS:
        rows += [("color", article(f"{color} {noun}")) for color in COLORS]
        rows += [("texture", article(f"{texture} {noun}")) for texture in TEXTURE_PHRASES]
        rows += [("texture", f"{article(noun)} {phrase}") for phrase in TEXTURE_PHRASES.values()]
        rows += [("location", f"{article(noun)} {phrase}") for phrases in LOCATION_PHRASES.values() for phrase in phrases]
        rows += [("size", article(f"{size} {noun}")) for size in SIZES]
        rows += [("background", f"{article(noun)} on a {word} background") for word in BACKGROUND_WORDS.values()]
    texts = tuple(dict.fromkeys(text for _, text in rows))
    label_of = dict((text, label) for label, text in reversed(rows))
    return Corpus(texts=texts, labels=tuple(label_of[t] for t in texts), source="synthetic")
