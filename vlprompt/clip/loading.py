"""Build CLIP models through open_clip, by name and pretrained tag or from a local file.

Accepted backbone names (``MODEL.BACKBONE.NAME``):

* the OpenAI names the CoOp family uses: ``RN50``, ``RN101``, ``RN50x4``, ``RN50x16``,
  ``RN50x64``, ``ViT-B/32``, ``ViT-B/16``, ``ViT-L/14``, ``ViT-L/14@336px``;
* any open_clip model name (``ViT-B-16-quickgelu``, ``ViT-B-32``, ``EVA02-B-16``,
  ``ViT-B-16-SigLIP2``, ``PE-Core-T-16-384``, ...; ``open_clip.list_models()``);
* a path to an open_clip model-config JSON file (its file stem becomes the model name), in
  either of open_clip's layouts: a model config (``embed_dim``, ``vision_cfg``, ``text_cfg``,
  optionally ``preprocess_cfg`` beside them) or the hub layout of ``open_clip_config.json``
  (``{"model_cfg": ..., "preprocess_cfg": ...}``).

Accepted weights (``MODEL.BACKBONE.WEIGHTS``): ``""`` (``openai`` for the OpenAI names),
an open_clip pretrained tag (``openai``, ``laion2b_s34b_b88k``, ...), ``random`` (no
weights, for tests), or a local file: OpenAI's TorchScript archives (``ViT-B-16.pt``),
open_clip checkpoints (``.pt``/``.pth``/``.bin``) and ``.safetensors`` files.

Loading a TorchScript archive runs the code it holds, and a weights path can come from a file
received from someone else (a run's ``config.yaml``, an exported classifier). So an archive is
loaded only when its SHA-256 is one of OpenAI's published CLIP archives
(:data:`OPENAI_ARCHIVE_SHA256`, the hashes their download URLs carry), or when the user trusts
it explicitly: ``load_clip(..., trust_torchscript=True)`` or the environment variable
``VLPROMPT_TRUST_TORCHSCRIPT=1`` (:data:`TRUST_TORCHSCRIPT_ENV`). Any other archive is refused
with that reason; every other file is read as a plain state dict (``weights_only``).

A pretrained tag is downloaded by open_clip (Hugging Face hub or a URL) unless its file is
already cached. Before a download, ``load_clip`` makes sure it can succeed quickly: with
``HF_HUB_OFFLINE`` or ``TRANSFORMERS_OFFLINE`` set, or when the download host (or the HTTPS
proxy) does not accept a connection within ``HUB_CONNECT_TIMEOUT_S`` seconds, a cached file
is loaded directly, and without one the load fails at once with the message naming
``MODEL.BACKBONE.WEIGHTS`` and the file to download, instead of after the hub client's
retries (about 30 s or more).

The tokenizer of a backbone is chosen by :mod:`vlprompt.clip.tokenizer_files`.

OpenAI weights were trained with QuickGELU. open_clip's plain ``ViT-B-16`` config uses
nn.GELU and only warns when combined with OpenAI weights, which silently changes every
feature; here QuickGELU is forced whenever the weights are OpenAI's, and checked after
loading.
"""
import contextlib
import dataclasses
import json
import logging
import os
import socket
import threading
import urllib.parse
import urllib.request
import warnings
import zipfile

import torch

from vlprompt.fileio import file_sha256

from .open_clip_import import enable_hf_text_towers
from .small_models import register_small_towers

__all__ = [
    "CLIPLoadError", "OPENAI_ARCHIVE_SHA256", "OPENAI_MODELS", "TRUST_TORCHSCRIPT_ENV", "BackboneConfig",
    "backbone_config", "load_clip", "resolve_model_name",
]

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
# SHA-256 of OpenAI's published TorchScript archives, by file name: the hash each download URL
# carries (https://openaipublic.azureedge.net/clip/models/<sha256>/<file>), which the original
# `clip` package and open_clip check after a download.
OPENAI_ARCHIVE_SHA256 = {
    "RN50.pt": "afeb0e10f9e5a86da6080e35cf09123aca3b358a0c3e3b6c78a7b63bc04b6762",
    "RN101.pt": "8fa8567bab74a42d41c5915025a8e4538c3bdbe8804a470a72f30b0d94fab599",
    "RN50x4.pt": "7e526bd135e493cef0776de27d5f42653e6b4c8bf9e0f653bb11773263205fdd",
    "RN50x16.pt": "52378b407f34354e150460fe41077663dd5b39c54cd0bfd2b27167a4a06ec9aa",
    "RN50x64.pt": "be1cfb55d75a9666199fb2206c106743da0f6468c9d327f3e0d0a543a9919d9c",
    "ViT-B-32.pt": "40d365715913c9da98579312b702a82c18be219cc2a73407c4526f58eba950af",
    "ViT-B-16.pt": "5806e77cd80f8b59890b7e101eabd078d9fb84e6937f9e85e4ecb61988df416f",
    "ViT-L-14.pt": "b8cca3fd41ae0c99ba7e8951adf17d267cdb84cd88be6f7c2e0eca1737a03836",
    "ViT-L-14-336px.pt": "3035c92b350959924f9f00213499208652fc7ea050643e8b385c2dac08641f02",
}
# The environment variable whose true value ("1", "true", "yes", "on") trusts every TorchScript archive.
TRUST_TORCHSCRIPT_ENV = "VLPROMPT_TRUST_TORCHSCRIPT"
_TRUE_VALUES = {"1", "ON", "YES", "TRUE"}
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
# What a model config must hold (open_clip registers no other file).
_MODEL_CONFIG_KEYS = ("embed_dim", "vision_cfg", "text_cfg")


class CLIPLoadError(RuntimeError):
    """Raised when a backbone name or its weights cannot be resolved or loaded."""


@dataclasses.dataclass
class BackboneConfig:
    """What ``MODEL.BACKBONE.NAME`` names, read without building the model.

    Attributes:
        model_name: the open_clip config name.
        is_openai_name: whether the name is one of OPENAI_MODELS (default weights ``openai``).
        model_cfg: the open_clip model config (``embed_dim``, ``vision_cfg``, ``text_cfg``, ...).
        preprocess_cfg: the model-config JSON's own ``preprocess_cfg`` ({} for none and for an
            open_clip name, whose preprocessing comes with its pretrained tags).
        folder: the model-config JSON's folder ("" for an open_clip name).
    """

    model_name: str
    is_openai_name: bool
    model_cfg: dict
    preprocess_cfg: dict = dataclasses.field(default_factory=dict)
    folder: str = ""


def _read_model_config_file(path):
    """(model config, its preprocess_cfg, whether open_clip can register the file as it is) of a
    model-config JSON in either of open_clip's layouts (module docstring)."""
    try:
        with open(path, encoding="utf-8") as f:
            data = json.load(f)
    except (OSError, ValueError) as error:
        raise CLIPLoadError(f'Model config file "{path}" (MODEL.BACKBONE.NAME) is not readable JSON: {error}.') from None
    hub_layout = isinstance(data, dict) and "model_cfg" in data
    if hub_layout:
        model_cfg = data["model_cfg"]
    else:
        model_cfg = {key: value for key, value in data.items() if key != "preprocess_cfg"} if isinstance(data, dict) else data
    if not isinstance(model_cfg, dict) or any(key not in model_cfg for key in _MODEL_CONFIG_KEYS):
        raise CLIPLoadError(
            f'Model config file "{path}" (MODEL.BACKBONE.NAME) is not an open_clip model config: expected a JSON '
            f"object with {', '.join(_MODEL_CONFIG_KEYS)} (optionally preprocess_cfg beside them), or open_clip's "
            'hub layout {"model_cfg": {...}, "preprocess_cfg": {...}} (open_clip_config.json).'
        )
    preprocess_cfg = data.get("preprocess_cfg") or {}
    if not isinstance(preprocess_cfg, dict):
        raise CLIPLoadError(f'Model config file "{path}": preprocess_cfg must be a JSON object, got {preprocess_cfg!r}.')
    return model_cfg, preprocess_cfg, not hub_layout and "preprocess_cfg" not in data


def _register_model_config(path, model_name, model_cfg, registrable):
    """Make ``model_name`` an open_clip model name for ``model_cfg`` (read from ``path``).

    A plain model config is registered by open_clip itself (``add_model_config``). open_clip
    registers no other layout (a ``preprocess_cfg`` beside the model keys would reach the model's
    constructor) and has no public way to register a config it did not read, so those go into its
    registry directly, where later rescans keep them. A config open_clip already holds with the
    same content is not registered again, so repeated loads in one process do not get slower.
    """
    import open_clip
    from open_clip import factory

    if open_clip.get_model_config(model_name) == model_cfg:
        return  # already held (add_model_config re-reads every file of its search list on each call)
    if registrable:
        open_clip.add_model_config(path)
    else:
        factory._MODEL_CONFIGS[model_name] = model_cfg


def backbone_config(name):
    """The :class:`BackboneConfig` of ``MODEL.BACKBONE.NAME`` (a model-config JSON is registered
    with open_clip under its file stem).

    Raises:
        CLIPLoadError: an empty or unknown name, or a JSON file that is missing or not a model config.
    """
    import open_clip

    register_small_towers()  # model configs may name the project's small timm towers
    if not name:
        raise CLIPLoadError(
            "MODEL.BACKBONE.NAME is empty. Set it to a CLIP backbone, e.g. 'ViT-B/16' "
            "(OpenAI weights), an open_clip model name such as 'ViT-B-16-quickgelu', or the "
            "path of an open_clip model-config JSON file."
        )
    if name in OPENAI_MODELS:
        model_name = OPENAI_MODELS[name][0]
        return BackboneConfig(model_name, True, open_clip.get_model_config(model_name))
    if name.endswith(".json"):
        if not os.path.isfile(name):
            raise CLIPLoadError(f'Model config file "{name}" (MODEL.BACKBONE.NAME) does not exist.')
        model_cfg, preprocess_cfg, registrable = _read_model_config_file(name)
        model_name = os.path.splitext(os.path.basename(name))[0]
        _register_model_config(name, model_name, model_cfg, registrable)
        return BackboneConfig(model_name, False, model_cfg, preprocess_cfg, os.path.dirname(os.path.abspath(name)))
    open_clip_name = name.replace("/", "-")
    if open_clip_name not in open_clip.list_models():
        raise CLIPLoadError(
            f"Unknown CLIP backbone '{name}'. Use one of the OpenAI names "
            f"{sorted(OPENAI_MODELS)}, an open_clip model name (open_clip.list_models() lists "
            "them), or the path of an open_clip model-config JSON file."
        )
    return BackboneConfig(open_clip_name, False, open_clip.get_model_config(open_clip_name))


def resolve_model_name(name):
    """Map ``MODEL.BACKBONE.NAME`` to an open_clip config name (see :func:`backbone_config`).

    Returns:
        (model_name, is_openai_name): the open_clip config name and whether ``name`` is
        one of the OpenAI CoOp-family names (whose default weights are ``openai``).
    """
    config = backbone_config(name)
    return config.model_name, config.is_openai_name


def _is_torchscript_archive(path):
    """True for TorchScript zip archives such as OpenAI's ViT-B-16.pt."""
    if not zipfile.is_zipfile(path):
        return False
    with zipfile.ZipFile(path) as archive:
        return any(n.endswith("constants.pkl") or "/code/" in n for n in archive.namelist())


def _trust_from_env():
    """Whether TRUST_TORCHSCRIPT_ENV is set to a true value."""
    return os.environ.get(TRUST_TORCHSCRIPT_ENV, "").strip().upper() in _TRUE_VALUES


def _check_torchscript_allowed(path, trust_torchscript):
    """CLIPLoadError unless the TorchScript archive ``path`` may be loaded (module docstring)."""
    if trust_torchscript or _trust_from_env():
        return
    sha256 = file_sha256(path)
    if sha256 in OPENAI_ARCHIVE_SHA256.values():
        return
    raise CLIPLoadError(
        f'"{path}" is a TorchScript archive, and loading one runs the code it holds; its SHA-256 {sha256} is not '
        f"one of OpenAI's published CLIP archives ({', '.join(OPENAI_ARCHIVE_SHA256)}), so it is not loaded. If "
        f"you trust the file, set {TRUST_TORCHSCRIPT_ENV}=1 (or pass trust_torchscript=True to load_clip); "
        "otherwise use a plain state dict or .safetensors file of the same weights."
    )


def _load_weights_file(model, path, trust_torchscript=False):
    """Load a local weights file into ``model`` (strict).

    TorchScript archives (OpenAI's, or trusted ones: :func:`_check_torchscript_allowed`) are read
    with torch.jit and their non-weight entries dropped; anything else goes through open_clip's
    checkpoint loader (weights only), which also converts third-party layouts and resizes
    position embeddings.

    Raises:
        CLIPLoadError: a TorchScript archive that may not be loaded.
    """
    import open_clip

    if _is_torchscript_archive(path):
        _check_torchscript_allowed(path, trust_torchscript)
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


def load_clip(name, weights="", device="cpu", trust_torchscript=False, image_size=None):
    """Build an open_clip CLIP model in fp32, frozen and in eval mode.

    Args:
        name: ``MODEL.BACKBONE.NAME`` (see module docstring).
        weights: ``MODEL.BACKBONE.WEIGHTS``: "" (default tag), a tag, "random" or a file.
        device: where to put the model.
        trust_torchscript: load a TorchScript archive whatever its SHA-256 (it runs its code);
            by default only OpenAI's published archives are (or with TRUST_TORCHSCRIPT_ENV set).
        image_size: with ``weights="random"``, build the image tower for this input size instead
            of the model config's (open_clip's ``force_image_size``: the positional embedding of
            that patch grid); None keeps the config's.

    Returns:
        (model, info): the open_clip model, and a dict with "model_name", "weights" (tag
        or file actually used) and "quick_gelu".
    """
    import open_clip
    from open_clip.transformer import QuickGELU

    model_name, is_openai_name = resolve_model_name(name)
    if "hf_model_name" in (open_clip.get_model_config(model_name) or {}).get("text_cfg", {}):
        enable_hf_text_towers()
    if not weights:
        if not is_openai_name:
            raise CLIPLoadError(
                f"No weights given for backbone '{name}'. Set MODEL.BACKBONE.WEIGHTS to an "
                "open_clip pretrained tag, a local weights file, or 'random'."
            )
        weights = "openai"
    if weights == "openai":
        weights = _find_openai_cache_file(name) or weights

    if image_size is not None and weights != "random":
        raise CLIPLoadError(f"An image size ({image_size}) is only chosen for random weights; the weights "
                            f"'{weights}' hold the positional embedding of their own input size.")
    if weights == "random":
        quick_gelu = is_openai_name
        with _quiet_open_clip():
            model = open_clip.create_model(model_name, pretrained=None, force_quick_gelu=quick_gelu,
                                           force_image_size=image_size)
    elif os.path.exists(weights):
        if not os.path.isfile(weights):
            raise CLIPLoadError(f'MODEL.BACKBONE.WEIGHTS "{weights}" is a folder; expected a weights file.')
        quick_gelu = is_openai_name or _is_torchscript_archive(weights)
        with _quiet_open_clip():
            model = open_clip.create_model(model_name, pretrained=None, force_quick_gelu=quick_gelu)
        try:
            _load_weights_file(model, weights, trust_torchscript)
        except CLIPLoadError:
            raise
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
            _load_weights_file(model, cached, trust_torchscript)
        _check_activation(model, weights == "openai", f"tag '{weights}'")

    quick_gelu = any(isinstance(m, QuickGELU) for m in model.modules())
    model = model.float().eval().to(device)
    for parameter in model.parameters():
        parameter.requires_grad_(False)
    return model, {"model_name": model_name, "weights": weights, "quick_gelu": quick_gelu}
