"""Which tokenizer a backbone uses, and where its files come from.

The tokenizer is chosen by the backbone's open_clip model config alone: CLIP's BPE tokenizer
(open_clip's ``SimpleTokenizer``), unless ``text_cfg.hf_tokenizer_name`` names a Hugging Face
tokenizer (open_clip's ``HFTokenizer``, e.g. ``timm/ViT-B-16-SigLIP2`` for SigLIP2), which is

* a hub repository, read from the local Hugging Face cache (``HF_HUB_CACHE``, or ``hub/`` under
  ``HF_HOME``; default ``~/.cache/huggingface/hub``) when a snapshot of it is there, without any
  network access; otherwise downloaded only when the hub answers at once (as
  :func:`vlprompt.clip.loading.load_clip` decides for weights), and else a :class:`CLIPLoadError`
  at once that names the repository, the cache and how to get the files onto this machine;
* or a local tokenizer folder (``tokenizer.json``, as the ``tokenizers`` library saves it, and
  ``tokenizer_config.json`` if any); a relative path is read from the model-config JSON's own
  folder, so that a repository can ship a small tokenizer beside its model config.

open_clip's own ``get_tokenizer`` also picks SigLIP's sentencepiece tokenizer for any model name
that contains "siglip" and fetches its vocabulary over HTTP; here a name never selects a
tokenizer: a text tower without ``hf_tokenizer_name`` must have CLIP's vocabulary
(``CLIP_BPE_VOCAB_SIZE`` ids), else the load is refused with what to set.
"""
import contextlib
import dataclasses
import functools
import os

from .loading import CLIPLoadError, _hub_unavailable, backbone_config

__all__ = ["CLIP_BPE_VOCAB_SIZE", "check_tokenizer", "get_tokenizer_for"]

# Number of token ids of CLIP's BPE tokenizer (open_clip's SimpleTokenizer), the tokenizer of every text
# tower whose model config names no other.
CLIP_BPE_VOCAB_SIZE = 49408
# open_clip's context length when a text config gives none.
DEFAULT_CONTEXT_LENGTH = 77
# The files that make a hub repository's tokenizer (one of them is enough to try loading it).
_TOKENIZER_FILES = ("tokenizer.json", "tokenizer_config.json")
# Files of a hub repository that a Hugging Face tokenizer may read (for the download command).
_HF_TOKENIZER_PATTERNS = ("*.json", "tokenizer*")


def _tokenizer_folder(hf_name, folder):
    """The local folder ``text_cfg.hf_tokenizer_name`` names, or None for a hub repository id.

    A folder that exists wins (a relative path is read from the model-config JSON's folder);
    a name written as a path (``./``, ``../``, ``/``, ``~`` or more than one ``/``) is a folder
    even when missing; anything else (``org/name``) is a hub repository.
    """
    path = os.path.expanduser(hf_name)
    if not os.path.isabs(path) and folder:
        path = os.path.normpath(os.path.join(folder, path))
    written_as_path = hf_name.startswith((".", "/", "~")) or hf_name.count("/") > 1 or os.sep in hf_name.replace("/", "")
    return path if os.path.isdir(path) or written_as_path else None


def _cached_snapshot(repo_id, cache_dir):
    """The folder of ``repo_id``'s cached snapshot in the Hugging Face cache ``cache_dir`` (the one
    its ``main`` reference names), or None when it holds none of _TOKENIZER_FILES."""
    from huggingface_hub import try_to_load_from_cache

    for filename in _TOKENIZER_FILES:
        path = try_to_load_from_cache(repo_id, filename, cache_dir=cache_dir)
        if isinstance(path, str) and os.path.isfile(path):
            return os.path.dirname(path)
    return None


@dataclasses.dataclass
class _HFTokenizerSource:
    """Where a backbone's Hugging Face tokenizer is read from (see :func:`_hf_tokenizer_source`)."""

    hf_name: str  # text_cfg.hf_tokenizer_name as written
    path: str  # what transformers loads: a folder, or the hub repository id
    is_folder: bool
    cache_dir: str  # the Hugging Face hub cache searched for a repository
    snapshot: str  # the cached snapshot folder of a repository ("" for none or for a folder)

    def describe(self):
        if self.is_folder:
            return f"the local tokenizer folder {self.path}"
        if self.snapshot:
            return f"Hugging Face tokenizer {self.path}, from the local cache ({self.snapshot})"
        return f"Hugging Face tokenizer {self.path}, downloaded into {self.cache_dir}"


@contextlib.contextmanager
def _hub_offline(offline):
    """huggingface_hub in offline mode while local files are loaded (``offline``): besides the files,
    its client fetches a registry from the hub once per process (for its user-agent header), which
    ``local_files_only`` does not prevent. The mode is read from ``huggingface_hub.constants`` on
    every call, so it is switched there and restored after."""
    if not offline:
        yield
        return
    from huggingface_hub import constants

    before = constants.HF_HUB_OFFLINE
    constants.HF_HUB_OFFLINE = True
    try:
        yield
    finally:
        constants.HF_HUB_OFFLINE = before


def _download_instructions(repo_id, cache_dir):
    patterns = " ".join(f'--include "{pattern}"' for pattern in _HF_TOKENIZER_PATTERNS)
    folder = "models--" + repo_id.replace("/", "--")
    return (
        f"On a machine with network access run `hf download {repo_id} {patterns}` (huggingface_hub's command "
        f"line), then copy the folder {folder} from that machine's Hugging Face cache (~/.cache/huggingface/hub "
        f"unless HF_HUB_CACHE or HF_HOME moves it) into {cache_dir} here (HF_HUB_CACHE or HF_HOME select another "
        f"cache); or save the tokenizer into a folder (transformers' AutoTokenizer.from_pretrained('{repo_id}')"
        f".save_pretrained(DIR)), copy DIR here and name it in text_cfg.hf_tokenizer_name of a local model-config "
        "JSON (a relative path is read from the JSON's folder)."
    )


def _hf_tokenizer_source(name, hf_name, folder):
    """The :class:`_HFTokenizerSource` of a backbone whose tokenizer is ``hf_name``.

    A repository that is not cached is downloaded only if the hub answers at once
    (:func:`_hub_unavailable`).

    Raises:
        CLIPLoadError: transformers is not installed, the named folder is missing, or the repository is
            neither cached nor downloadable now (the message says what to download and where to put it).
    """
    import importlib.util

    from huggingface_hub import constants

    where = f"backbone '{name}' tokenizes text with the Hugging Face tokenizer '{hf_name}' (text_cfg.hf_tokenizer_name)"
    if importlib.util.find_spec("transformers") is None:
        raise CLIPLoadError(f"The {where}, which needs the transformers package: pip install transformers.")
    cache_dir = constants.HF_HUB_CACHE
    path = _tokenizer_folder(hf_name, folder)
    if path is not None:
        if not os.path.isdir(path):
            raise CLIPLoadError(
                f'The {where}, read as the folder "{path}"' + (" (relative to the model-config JSON's folder)"
                                                                if folder and not os.path.isabs(hf_name) else "")
                + ", which does not exist. Put the tokenizer's files there (tokenizer.json, and tokenizer_config.json "
                "if it has one), or name a Hugging Face hub repository (org/name)."
            )
        return _HFTokenizerSource(hf_name, path, True, cache_dir, "")
    snapshot = _cached_snapshot(hf_name, cache_dir)
    if snapshot is None:
        unavailable = _hub_unavailable({"hf_hub": f"{hf_name}/"})
        if unavailable:
            beside = (f" There is no folder {os.path.join(folder, hf_name)} beside the model config either."
                      if folder else "")
            raise CLIPLoadError(
                f"The {where}, whose tokenizer files ({', '.join(_TOKENIZER_FILES)}) are not in the local Hugging "
                f"Face cache {cache_dir} and cannot be downloaded now ({unavailable}).{beside} "
                + _download_instructions(hf_name, cache_dir)
            )
    return _HFTokenizerSource(hf_name, hf_name, False, cache_dir, snapshot or "")


def _text_cfg(config):
    return config.model_cfg.get("text_cfg", {})


def _check_clip_vocabulary(name, text_cfg):
    """A text tower without ``hf_tokenizer_name`` is read with CLIP's BPE tokenizer: its vocabulary
    must be that tokenizer's (CLIP_BPE_VOCAB_SIZE ids)."""
    vocab_size = text_cfg.get("vocab_size", CLIP_BPE_VOCAB_SIZE)
    if vocab_size == CLIP_BPE_VOCAB_SIZE:
        return
    siglip = (" open_clip would pick SigLIP's sentencepiece tokenizer by the name and fetch its vocabulary over "
              "HTTP; here a tokenizer is chosen by the model config, never by the name, and only read from "
              "local files or the Hugging Face hub." if "siglip" in name.lower() else "")
    raise CLIPLoadError(
        f"Backbone '{name}' has a text vocabulary of {vocab_size} tokens (text_cfg.vocab_size), but its model "
        f"config names no tokenizer (text_cfg.hf_tokenizer_name), so CLIP's BPE tokenizer of "
        f"{CLIP_BPE_VOCAB_SIZE} tokens would be used.{siglip} Set text_cfg.hf_tokenizer_name to the tokenizer the "
        "text tower was trained with: a Hugging Face hub repository (e.g. timm/ViT-B-16-SigLIP) or a local "
        "tokenizer folder."
    )


def check_tokenizer(name):
    """Check, without loading it, that the tokenizer of ``MODEL.BACKBONE.NAME`` can be loaded now (a
    cheap pre-flight check, before any data loads).

    Returns:
        a line for the log naming the tokenizer and where it is read from.

    Raises:
        CLIPLoadError: see :func:`backbone_config`, :func:`_hf_tokenizer_source` and the vocabulary check.
    """
    config = backbone_config(name)
    text_cfg = _text_cfg(config)
    hf_name = text_cfg.get("hf_tokenizer_name", "")
    if not hf_name:
        _check_clip_vocabulary(name, text_cfg)
        return f"Tokenizer: CLIP's BPE tokenizer (context length {text_cfg.get('context_length', DEFAULT_CONTEXT_LENGTH)})"
    source = _hf_tokenizer_source(name, hf_name, config.folder)
    return f"Tokenizer: {source.describe()} (context length {text_cfg.get('context_length', DEFAULT_CONTEXT_LENGTH)})"


@functools.lru_cache(maxsize=8)
def _clip_bpe_tokenizer(context_length, kwargs):
    """CLIP's BPE tokenizer (``SimpleTokenizer``), built once per setting: reading its merges costs
    about 0.1 s, and it keeps nothing of what it tokenizes but its own word cache."""
    from open_clip.tokenizer import SimpleTokenizer

    return SimpleTokenizer(context_length=context_length, **dict(kwargs))


def get_tokenizer_for(name):
    """open_clip tokenizer of a backbone given as ``MODEL.BACKBONE.NAME``, chosen by its model config
    (module docstring): open_clip's ``SimpleTokenizer`` (CLIP's BPE) or ``HFTokenizer``, with the
    config's context length and ``tokenizer_kwargs`` as open_clip passes them.

    Raises:
        CLIPLoadError: the tokenizer cannot be found or loaded (one paragraph: what is missing and
            how to get it).
    """
    from open_clip.tokenizer import HFTokenizer

    config = backbone_config(name)
    text_cfg = _text_cfg(config)
    context_length = text_cfg.get("context_length", DEFAULT_CONTEXT_LENGTH)
    kwargs = dict(text_cfg.get("tokenizer_kwargs") or {})
    hf_name = text_cfg.get("hf_tokenizer_name", "")
    if not hf_name:
        _check_clip_vocabulary(name, text_cfg)
        return _clip_bpe_tokenizer(context_length, tuple(sorted(kwargs.items())))
    source = _hf_tokenizer_source(name, hf_name, config.folder)
    # A cached repository is read as the folder of its snapshot: by repository id, transformers would also
    # look for files the repository does not have (its config.json), which an offline cache cannot tell
    # from files not downloaded.
    folder = source.path if source.is_folder else source.snapshot
    try:
        with _hub_offline(bool(folder)):
            return HFTokenizer(folder or source.path, context_length=context_length, cache_dir=source.cache_dir,
                               tokenizer_mode=text_cfg.get("tokenizer_mode"), local_files_only=bool(folder), **kwargs)
    except Exception as error:  # noqa: BLE001  (transformers raises OSError, ValueError, ... for unusable files)
        found = f"; {folder} holds {', '.join(sorted(os.listdir(folder))) or 'no files'}" if folder else ""
        detail = str(error).strip().splitlines()[0] if str(error).strip() else "no message"
        hint = "" if source.is_folder else " " + _download_instructions(source.path, source.cache_dir)
        raise CLIPLoadError(
            f"Backbone '{name}': could not load its tokenizer, {source.describe()} ({type(error).__name__}: "
            f"{detail}){found}.{hint}"
        ) from error
