"""A hub weights name without network fails in seconds, not after the hub client's retries.

No test here opens a real connection: ``socket.create_connection`` is replaced, and
``open_clip.create_model`` records whether a download was asked for (``pretrained`` set).
"""
import os
import socket
import time

import open_clip
import pytest
import torch

from vlprompt.clip import loading
from vlprompt.clip.loading import CLIPLoadError, load_clip


@pytest.fixture
def no_network(monkeypatch, tmp_path):
    """Empty weight caches, every connection refused, downloads recorded; yields the records."""
    records = {"connections": [], "downloads": []}

    def refuse(address, timeout=None, *args, **kwargs):
        records["connections"].append((address, timeout))
        raise OSError("network is unreachable (test)")

    real_create_model = open_clip.create_model

    def create_model(model_name, pretrained=None, **kwargs):
        if pretrained:
            records["downloads"].append((model_name, pretrained))
            raise RuntimeError("a download was attempted (test)")
        return real_create_model(model_name, pretrained=None, **kwargs)

    from huggingface_hub import constants

    monkeypatch.setattr(socket, "create_connection", refuse)
    monkeypatch.setattr(open_clip, "create_model", create_model)
    monkeypatch.setattr(constants, "HF_HUB_CACHE", str(tmp_path / "hf"))
    monkeypatch.setattr(loading, "OPENAI_CACHE_DIR", str(tmp_path / "clip"))
    for variable in ("HF_HUB_OFFLINE", "TRANSFORMERS_OFFLINE"):
        monkeypatch.delenv(variable, raising=False)
    for variable in ("https_proxy", "HTTPS_PROXY", "http_proxy", "HTTP_PROXY", "all_proxy", "ALL_PROXY"):
        monkeypatch.delenv(variable, raising=False)
    return records


def _fails_fast(name="ViT-B/16", weights=""):
    start = time.monotonic()
    with pytest.raises(CLIPLoadError) as error:
        load_clip(name, weights)
    return str(error.value), time.monotonic() - start


@pytest.mark.parametrize("variable", ["HF_HUB_OFFLINE", "TRANSFORMERS_OFFLINE"])
def test_offline_env_fails_at_once_without_download_or_connection(no_network, monkeypatch, variable):
    monkeypatch.setenv(variable, "1")
    message, seconds = _fails_fast()
    assert seconds < 5
    assert no_network["downloads"] == [] and no_network["connections"] == []
    assert "MODEL.BACKBONE.WEIGHTS /path/to/ViT-B-16.pt" in message
    assert f"{variable}=1 is set" in message and "no downloaded copy is cached" in message


def test_unreachable_hub_fails_after_one_short_connect(no_network):
    message, seconds = _fails_fast()
    assert seconds < 5
    assert no_network["downloads"] == []
    assert [address for address, _ in no_network["connections"]] == [("huggingface.co", 443)]
    assert all(timeout <= loading.HUB_CONNECT_TIMEOUT_S <= 2 for _, timeout in no_network["connections"])
    assert "huggingface.co:443" in message and "MODEL.BACKBONE.WEIGHTS" in message


def test_hanging_connect_is_cut_at_the_timeout(no_network, monkeypatch):
    """A connect that never returns (e.g. a stuck name lookup) costs HUB_CONNECT_TIMEOUT_S, not more."""
    monkeypatch.setattr(loading, "HUB_CONNECT_TIMEOUT_S", 0.2)

    def hang(*args, **kwargs):
        time.sleep(3)
        raise OSError("gave up (test)")

    monkeypatch.setattr(socket, "create_connection", hang)
    message, seconds = _fails_fast()
    assert seconds < 2
    assert "did not answer within 0.2 s" in message and no_network["downloads"] == []


def test_proxy_is_probed_instead_of_the_host(no_network, monkeypatch):
    monkeypatch.setenv("https_proxy", "http://proxy.example:3128")
    message, _ = _fails_fast()
    assert [address for address, _ in no_network["connections"]] == [("proxy.example", 3128)]
    assert "the proxy proxy.example:3128" in message


def test_reachable_hub_downloads_as_before(no_network, monkeypatch):
    monkeypatch.setattr(socket, "create_connection", lambda address, timeout=None: socket.socket())
    message, _ = _fails_fast()
    assert no_network["downloads"] == [("ViT-B-16", "openai")]
    assert "a download was attempted (test)" in message and "MODEL.BACKBONE.WEIGHTS" in message


@pytest.mark.slow  # builds the real ViT-B/16 architecture (random weights)
def test_offline_loads_a_cached_hub_file_without_download(no_network, monkeypatch, tmp_path):
    """Offline, a file already in the Hugging Face cache is loaded (open_clip's repo and file names)."""
    monkeypatch.setenv("HF_HUB_OFFLINE", "1")
    repo = os.path.join(str(tmp_path / "hf"), "models--timm--vit_base_patch16_clip_224.openai")
    snapshot = os.path.join(repo, "snapshots", "0" * 40)
    os.makedirs(snapshot)
    os.makedirs(os.path.join(repo, "refs"))
    with open(os.path.join(repo, "refs", "main"), "w") as f:
        f.write("0" * 40)
    cached = os.path.join(snapshot, "open_clip_pytorch_model.bin")
    torch.save({}, cached)
    assert loading._cached_pretrained_file(open_clip.get_pretrained_cfg("ViT-B-16", "openai")) == cached

    loaded = []
    monkeypatch.setattr(loading, "_load_weights_file", lambda model, path, trust_torchscript=False: loaded.append(path))
    model, info = load_clip("ViT-B/16")
    assert loaded == [cached] and no_network["downloads"] == [] and no_network["connections"] == []
    assert info["quick_gelu"] and not model.training
