"""Build CLIP models through open_clip, by name and pretrained tag or from a local file.

Accepted backbone names (``MODEL.BACKBONE.NAME``):

* the OpenAI names the CoOp family uses: ``RN50``, ``RN101``, ``RN50x4``, ``RN50x16``,
  ``RN50x64``, ``ViT-B/32``, ``ViT-B/16``, ``ViT-L/14``, ``ViT-L/14@336px``;
* any open_clip model name (``ViT-B-16-quickgelu``, ``ViT-B-32``, ...);
* a path to an open_clip model-config JSON file (its file stem becomes the model name).

Accepted weights (``MODEL.BACKBONE.WEIGHTS``): ``""`` (``openai`` for the OpenAI names),
an open_clip pretrained tag (``openai``, ``laion2b_s34b_b88k``, ...), ``random`` (no
weights, for tests), or a local file: OpenAI's TorchScript archives (``ViT-B-16.pt``),
open_clip checkpoints (``.pt``/``.pth``/``.bin``) and ``.safetensors`` files.

A pretrained tag is downloaded by open_clip (Hugging Face hub or a URL) unless its file is
already cached. Before a download, ``load_clip`` makes sure it can succeed quickly: with
``HF_HUB_OFFLINE`` or ``TRANSFORMERS_OFFLINE`` set, or when the download host (or the HTTPS
proxy) does not accept a connection within ``HUB_CONNECT_TIMEOUT_S`` seconds, a cached file
is loaded directly, and without one the load fails at once with the message naming
``MODEL.BACKBONE.WEIGHTS`` and the file to download, instead of after the hub client's
retries (about 30 s or more).

OpenAI weights were trained with QuickGELU. open_clip's plain ``ViT-B-16`` config uses
nn.GELU and only warns when combined with OpenAI weights, which silently changes every
feature; here QuickGELU is forced whenever the weights are OpenAI's, and checked after
loading.
"""
import contextlib
import functools
import logging
import os
import socket
import threading
import urllib.parse
import urllib.request
import warnings
import zipfile

import torch

__all__ = ["CLIPLoadError", "OPENAI_MODELS", "load_clip", "resolve_model_name", "register_model_config",
           "get_tokenizer_for"]

# CoOp-family name -> (open_clip config name, file name in OpenAI's own download cache)
OPENAI_MODELS = {
    "RN50": ("RN50", "RN50.pt"),
    "RN101": ("RN101", "RN101.pt"),
    "RN50x4": ("RN50x4", "RN50x4.pt"),
    "RN50x16": ("RN50x16", "RN50x16.pt"),
    "RN50x64": ("RN50x64", "RN50x64.pt"),
    "ViT-B/32": ("ViT-B-32", "ViT-B-32.pt"),
    "ViT-B/16": ("ViT-B-16", "ViT-B-16.pt"),
    "ViT-L/14": ("ViT-L-14", "ViT-L-14.pt"),
    "ViT-L/14@336px": ("ViT-L-14-336", "ViT-L-14-336px.pt"),
}
# Where the original `clip` package (and so every CoOp-family user) caches OpenAI files.
OPENAI_CACHE_DIR = os.path.expanduser("~/.cache/clip")
# State-dict entries of TorchScript archives that are not weights of the open_clip model
# (the causal mask is a non-persistent buffer in open_clip).
_TORCHSCRIPT_EXTRA_KEYS = ("input_resolution", "context_length", "vocab_size", "attn_mask")
# Seconds a download host (or proxy) gets to accept a TCP connection before the hub counts as unreachable.
HUB_CONNECT_TIMEOUT_S = 2.0
# Environment variables that switch the Hugging Face hub client to offline mode.
OFFLINE_ENV_VARS = ("HF_HUB_OFFLINE", "TRANSFORMERS_OFFLINE")
# open_clip's names of a hub repository's weights when its pretrained entry names no file.
_HF_DEFAULT_FILES = ("open_clip_model.safetensors", "open_clip_pytorch_model.bin")


class CLIPLoadError(RuntimeError):
    """Raised when a backbone name or its weights cannot be resolved or loaded."""


def register_model_config(path):
    """Register the open_clip model-config JSON file ``path`` under its file stem; return the stem.

    open_clip's ``add_model_config`` appends the path to its search list and then re-reads every
    file of that list, so calling it on every load made each load slower than the previous one (a
    long process, such as an in-process grid or a test worker, re-read thousands of files per
    load). The file is added only when open_clip does not already hold its content under its stem.
    """
    import json

    import open_clip

    stem = os.path.splitext(os.path.basename(path))[0]
    with open(path, encoding="utf-8") as f:
        content = json.load(f)
    if open_clip.get_model_config(stem) != content:
        open_clip.add_model_config(path)
    return stem


def resolve_model_name(name):
    """Map ``MODEL.BACKBONE.NAME`` to an open_clip config name.

    Returns:
        (model_name, is_openai_name): the open_clip config name and whether ``name`` is
        one of the OpenAI CoOp-family names (whose default weights are ``openai``).
    """
    import open_clip

    if not name:
        raise CLIPLoadError(
            "MODEL.BACKBONE.NAME is empty. Set it to a CLIP backbone, e.g. 'ViT-B/16' "
            "(OpenAI weights), an open_clip model name such as 'ViT-B-16-quickgelu', or the "
            "path of an open_clip model-config JSON file."
        )
    if name in OPENAI_MODELS:
        return OPENAI_MODELS[name][0], True
    if name.endswith(".json"):
        if not os.path.isfile(name):
            raise CLIPLoadError(f'Model config file "{name}" (MODEL.BACKBONE.NAME) does not exist.')
        return register_model_config(name), False
    open_clip_name = name.replace("/", "-")
    if open_clip_name not in open_clip.list_models():
        raise CLIPLoadError(
            f"Unknown CLIP backbone '{name}'. Use one of the OpenAI names "
            f"{sorted(OPENAI_MODELS)}, an open_clip model name (open_clip.list_models() lists "
            "them), or the path of an open_clip model-config JSON file."
        )
    return open_clip_name, False


def _is_torchscript_archive(path):
    """True for TorchScript zip archives such as OpenAI's ViT-B-16.pt."""
    if not zipfile.is_zipfile(path):
        return False
    with zipfile.ZipFile(path) as archive:
        return any(n.endswith("constants.pkl") or "/code/" in n for n in archive.namelist())


def _load_weights_file(model, path):
    """Load a local weights file into ``model`` (strict).

    OpenAI TorchScript archives are read with torch.jit and their non-weight entries
    dropped; anything else goes through open_clip's checkpoint loader, which also
    converts third-party layouts and resizes position embeddings.
    """
    import open_clip

    if _is_torchscript_archive(path):
        with warnings.catch_warnings():
            warnings.simplefilter("ignore", FutureWarning)  # torch.jit is deprecated
            state_dict = torch.jit.load(path, map_location="cpu").state_dict()
        for key in _TORCHSCRIPT_EXTRA_KEYS:
            state_dict.pop(key, None)
        model.load_state_dict(state_dict, strict=True)
    else:
        open_clip.load_checkpoint(model, path, strict=True)


def _find_openai_cache_file(backbone_name):
    """Path of OpenAI's cached file for a CoOp-family name if present, else None."""
    if backbone_name not in OPENAI_MODELS:
        return None
    path = os.path.join(OPENAI_CACHE_DIR, OPENAI_MODELS[backbone_name][1])
    return path if os.path.isfile(path) else None


@contextlib.contextmanager
def _quiet_open_clip():
    """Silence open_clip's root-logger notice about randomly initialised models (the
    weights are loaded right after)."""
    logger = logging.getLogger()
    level = logger.level
    logger.setLevel(logging.ERROR)
    try:
        yield
    finally:
        logger.setLevel(level)


def _check_activation(model, expect_quick_gelu, source):
    """Assert that the MLP activations match the weights' training activation."""
    from open_clip.transformer import QuickGELU

    has_quick_gelu = any(isinstance(m, QuickGELU) for m in model.modules())
    if expect_quick_gelu and not has_quick_gelu:
        raise CLIPLoadError(
            f"{source} holds OpenAI weights, which need QuickGELU, but the built model uses "
            "another activation. Use an OpenAI backbone name (e.g. 'ViT-B/16') or a "
            "'-quickgelu' open_clip config."
        )


def _offline_hint(name, weights, error):
    example_file = OPENAI_MODELS.get(name, (None, "<file>.pt"))[1]
    return CLIPLoadError(
        f"Could not obtain the pretrained weights '{weights}' for backbone '{name}' ({error}). "
        "Without network access, download the weights on another machine and pass the file: "
        f"MODEL.BACKBONE.WEIGHTS /path/to/{example_file} (OpenAI TorchScript files, open_clip "
        f"checkpoints and .safetensors work). For OpenAI weights, placing the file in "
        f"{OPENAI_CACHE_DIR}/ (where the original clip package caches it) also works."
    )


def _offline_env():
    """The first of OFFLINE_ENV_VARS set to a true value ("1", "true", "yes", "on"), else None."""
    for variable in OFFLINE_ENV_VARS:
        if os.environ.get(variable, "").strip().upper() in {"1", "ON", "YES", "TRUE"}:
            return variable
    return None


def _download_url(pretrained_cfg):
    """The URL open_clip downloads a pretrained entry from (its hub repository or its plain URL)."""
    import open_clip

    hf_hub = pretrained_cfg.get("hf_hub", "")
    if hf_hub and open_clip.pretrained.has_hf_hub():
        from huggingface_hub import constants

        return f"{constants.ENDPOINT.rstrip('/')}/{hf_hub}"
    return pretrained_cfg.get("url", "")


def _can_connect(host, port, timeout):
    """Whether a TCP connection to (host, port) opens within ``timeout`` seconds, name lookup included."""
    opened = []

    def probe():
        try:
            socket.create_connection((host, port), timeout=timeout).close()
            opened.append(True)
        except OSError:
            pass

    thread = threading.Thread(target=probe, daemon=True)
    thread.start()
    thread.join(timeout)
    return bool(opened)


def _hub_unavailable(pretrained_cfg):
    """Why a download of ``pretrained_cfg`` cannot work now (a phrase), or None if it may be tried.

    Offline mode (OFFLINE_ENV_VARS) needs no check; otherwise the download host, or the HTTPS
    proxy that the environment sets for it, must accept a connection within
    HUB_CONNECT_TIMEOUT_S seconds.
    """
    variable = _offline_env()
    if variable:
        return f"{variable}={os.environ[variable]} is set (offline mode)"
    url = urllib.parse.urlsplit(_download_url(pretrained_cfg))
    if not url.hostname:
        return None
    target, what = url, "the download host"
    proxy = urllib.request.getproxies().get(url.scheme)
    if proxy and not urllib.request.proxy_bypass(url.hostname):
        target, what = urllib.parse.urlsplit(proxy if "://" in proxy else f"http://{proxy}"), "the proxy"
    port = target.port or (443 if target.scheme == "https" else 80)
    if _can_connect(target.hostname, port, HUB_CONNECT_TIMEOUT_S):
        return None
    return f"{what} {target.hostname}:{port} did not answer within {HUB_CONNECT_TIMEOUT_S:g} s (no network?)"


def _cached_pretrained_file(pretrained_cfg):
    """The already-downloaded file of a pretrained entry (Hugging Face cache or open_clip's URL
    cache ~/.cache/clip), or None."""
    import open_clip

    hf_hub = pretrained_cfg.get("hf_hub", "")
    if hf_hub and open_clip.pretrained.has_hf_hub():
        from huggingface_hub import try_to_load_from_cache

        repo_id, filename = os.path.split(hf_hub)  # "org/repo/" names no file: open_clip's defaults
        candidates = (os.path.splitext(filename)[0] + ".safetensors", filename) if filename else _HF_DEFAULT_FILES
        for candidate in candidates:
            path = try_to_load_from_cache(repo_id, candidate)
            if isinstance(path, str) and os.path.isfile(path):
                return path
    url = pretrained_cfg.get("url", "")
    if url:
        path = os.path.join(OPENAI_CACHE_DIR, os.path.basename(url))
        if os.path.isfile(path):
            return path
    return None


def load_clip(name, weights="", device="cpu"):
    """Build an open_clip CLIP model in fp32, frozen and in eval mode.

    Args:
        name: ``MODEL.BACKBONE.NAME`` (see module docstring).
        weights: ``MODEL.BACKBONE.WEIGHTS``: "" (default tag), a tag, "random" or a file.
        device: where to put the model.

    Returns:
        (model, info): the open_clip model, and a dict with "model_name", "weights" (tag
        or file actually used) and "quick_gelu".
    """
    import open_clip
    from open_clip.transformer import QuickGELU

    model_name, is_openai_name = resolve_model_name(name)
    if not weights:
        if not is_openai_name:
            raise CLIPLoadError(
                f"No weights given for backbone '{name}'. Set MODEL.BACKBONE.WEIGHTS to an "
                "open_clip pretrained tag, a local weights file, or 'random'."
            )
        weights = "openai"
    if weights == "openai":
        weights = _find_openai_cache_file(name) or weights

    if weights == "random":
        quick_gelu = is_openai_name
        with _quiet_open_clip():
            model = open_clip.create_model(model_name, pretrained=None, force_quick_gelu=quick_gelu)
    elif os.path.exists(weights):
        if not os.path.isfile(weights):
            raise CLIPLoadError(f'MODEL.BACKBONE.WEIGHTS "{weights}" is a folder; expected a weights file.')
        quick_gelu = is_openai_name or _is_torchscript_archive(weights)
        with _quiet_open_clip():
            model = open_clip.create_model(model_name, pretrained=None, force_quick_gelu=quick_gelu)
        try:
            _load_weights_file(model, weights)
        except Exception as error:
            raise CLIPLoadError(
                f'Cannot load CLIP weights from "{weights}" into backbone "{name}" '
                f"({model_name}): {error}. Expected an OpenAI TorchScript file (e.g. "
                "ViT-B-16.pt), an open_clip checkpoint (.pt/.pth/.bin) or a .safetensors "
                "file whose tensors match that backbone."
            ) from error
        _check_activation(model, quick_gelu, f'"{weights}"')
    else:
        if os.sep in weights or weights.endswith((".pt", ".pth", ".bin", ".safetensors")):
            raise CLIPLoadError(f'CLIP weights file "{weights}" (MODEL.BACKBONE.WEIGHTS) does not exist.')
        tags = open_clip.list_pretrained_tags_by_model(model_name)
        if weights not in tags:
            raise CLIPLoadError(
                f"'{weights}' is neither a file nor a pretrained tag of '{model_name}' "
                f"(its tags: {tags or 'none'})."
            )
        quick_gelu = is_openai_name or weights == "openai" or "quickgelu" in model_name
        pretrained_cfg = open_clip.get_pretrained_cfg(model_name, weights)
        unavailable = _hub_unavailable(pretrained_cfg)
        if unavailable is None:
            try:
                model = open_clip.create_model(model_name, pretrained=weights, force_quick_gelu=quick_gelu)
            except Exception as error:  # open_clip raises RuntimeError for failed hub downloads
                raise _offline_hint(name, weights, error) from error
        else:
            cached = _cached_pretrained_file(pretrained_cfg)
            if cached is None:
                raise _offline_hint(name, weights, f"{unavailable}, and no downloaded copy is cached")
            print(f"No hub access ({unavailable}): loading the cached weights {cached}")
            with _quiet_open_clip():
                model = open_clip.create_model(model_name, pretrained=None, force_quick_gelu=quick_gelu)
            _load_weights_file(model, cached)
        _check_activation(model, weights == "openai", f"tag '{weights}'")

    quick_gelu = any(isinstance(m, QuickGELU) for m in model.modules())
    model = model.float().eval().to(device)
    for parameter in model.parameters():
        parameter.requires_grad_(False)
    return model, {"model_name": model_name, "weights": weights, "quick_gelu": quick_gelu}


def get_tokenizer_for(name):
    """open_clip tokenizer of a backbone given as ``MODEL.BACKBONE.NAME``, shared by the callers of
    one process with the same model config (building one reads CLIP's 49k BPE merges; a tokenizer
    holds no state but a cache of encoded words)."""
    import json

    import open_clip

    model_name, _ = resolve_model_name(name)
    return _tokenizer(model_name, json.dumps(open_clip.get_model_config(model_name), sort_keys=True))


@functools.lru_cache(maxsize=8)
def _tokenizer(model_name, config):
    """open_clip's tokenizer of ``model_name``, whose model config is ``config`` (JSON, the cache key)."""
    import open_clip

    return open_clip.get_tokenizer(model_name)
