"""Backbone names, model-config files and tokenizers of every family, offline.

Hugging Face tokenizers come from a local hub cache written here (``tests/hf_files.py``: a
WordLevel tokenizer made with the ``tokenizers`` library, laid out as huggingface_hub caches a
repository); no test opens a connection (``socket.create_connection`` refuses and records) or
fetches a vocabulary over HTTP (``fsspec.open`` refuses and records).
"""
import copy
import json
import socket
import time

import fsspec
import open_clip
import pytest
import torch

from hf_files import EOS, PAD, WORDS, write_hub_snapshot, write_word_tokenizer
from vlprompt.clip import (
    CLIPLoadError, PromptTooLongError, Tokenizer, backbone_config, check_tokenizer, get_tokenizer_for, load_clip,
    resolve_model_name,
)
from vlprompt.testing import FAMILY_TEST_CONFIGS

SIGLIP2_REPO = "timm/ViT-B-16-SigLIP2"
CONTEXT = 16


def word_ids(text):
    """The ids of the words of ``text`` in hf_files' vocabulary (<pad> 0, </s> 1, <unk> 2, then WORDS)."""
    return [3 + WORDS.index(word) for word in text.split()]


@pytest.fixture
def hub(monkeypatch, tmp_path):
    """An empty Hugging Face cache (HF_HOME under tmp_path), no offline variable set, every connection
    refused and every fsspec open refused; yields {"cache": folder, "connections": [...], "fsspec": [...]}."""
    from huggingface_hub import constants

    records = {"cache": str(tmp_path / "hf" / "hub"), "connections": [], "fsspec": []}

    def refuse(address, timeout=None, *args, **kwargs):
        records["connections"].append((address, timeout))
        raise OSError("network is unreachable (test)")

    def no_fsspec(url, *args, **kwargs):
        records["fsspec"].append(url)
        raise OSError("no HTTP (test)")

    monkeypatch.setenv("HF_HOME", str(tmp_path / "hf"))
    monkeypatch.setenv("HF_HUB_CACHE", records["cache"])
    monkeypatch.setattr(constants, "HF_HUB_CACHE", records["cache"])  # read by huggingface_hub at import
    for variable in ("HF_HUB_OFFLINE", "TRANSFORMERS_OFFLINE", "https_proxy", "HTTPS_PROXY", "all_proxy", "ALL_PROXY"):
        monkeypatch.delenv(variable, raising=False)
    monkeypatch.setattr(socket, "create_connection", refuse)
    monkeypatch.setattr(fsspec, "open", no_fsspec)
    return records


def cache_siglip2_tokenizer(hub, tmp_path):
    """A small stand-in for timm/ViT-B-16-SigLIP2's tokenizer in the hub cache; returns its vocabulary size."""
    source = tmp_path / "tokenizer-source"
    vocab_size = write_word_tokenizer(str(source), CONTEXT)
    # the tokenizer files of timm's SigLIP repositories (beside open_clip_config.json and the weights; no config.json)
    write_hub_snapshot(hub["cache"], SIGLIP2_REPO, str(source), extra={
        "tokenizer_config.json": {"tokenizer_class": "PreTrainedTokenizerFast", "pad_token": PAD, "eos_token": EOS},
        "special_tokens_map.json": {"pad_token": PAD, "eos_token": EOS},
    })
    return vocab_size


def siglip_config(hf_tokenizer_name, vocab_size):
    """The small SigLIP-family model config with a Hugging Face tokenizer (context length CONTEXT)."""
    config = copy.deepcopy(FAMILY_TEST_CONFIGS["siglip"])
    config["text_cfg"].update(hf_tokenizer_name=hf_tokenizer_name, vocab_size=vocab_size, context_length=CONTEXT,
                              tokenizer_kwargs={"clean": "canonicalize"})
    return config


def write_json(path, data):
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(json.dumps(data), encoding="utf-8")
    return str(path)


def test_a_siglip_config_reads_its_hub_tokenizer_from_the_local_cache_offline(hub, tmp_path):
    vocab_size = cache_siglip2_tokenizer(hub, tmp_path)
    config = write_json(tmp_path / "models" / "tiny-siglip-hub-clip.json", siglip_config(SIGLIP2_REPO, vocab_size))
    assert check_tokenizer(config).startswith(f"Tokenizer: Hugging Face tokenizer {SIGLIP2_REPO}, from the local cache")
    tokenizer = Tokenizer(config)
    assert (tokenizer.context_length, tokenizer.start_tokens, tokenizer.special_tokens) == (CONTEXT, 0, 1)
    ids = tokenizer(["A photo of a dog.", "red star"])
    assert ids.tolist() == [word_ids("a photo of a dog") + [1] + [0] * 10, word_ids("red star") + [1] + [0] * 13]
    assert tokenizer.num_tokens("A photo of a dog.") == 5
    assert tokenizer(["a photo of a dog"], reserve=10).shape == (1, CONTEXT)  # 5 words + </s> + 10 = 16
    with pytest.raises(PromptTooLongError, match="has 5 tokens; at most 4 fit in the context length 16 when 11"):
        tokenizer(["a photo of a dog"], reserve=11)
    with pytest.raises(PromptTooLongError, match="has 16 tokens; at most 15"):
        tokenizer([" ".join(["x"] * 16)])  # open_clip would cut the </s> token silently
    model, _ = load_clip(config, "random")
    assert torch.isfinite(model.encode_text(ids)).all()
    assert hub["connections"] == [] and hub["fsspec"] == []


def test_the_open_clip_siglip2_name_reads_the_same_cache(hub, tmp_path):
    cache_siglip2_tokenizer(hub, tmp_path)
    tokenizer = Tokenizer("ViT-B-16-SigLIP2")
    assert type(get_tokenizer_for("ViT-B-16-SigLIP2")).__name__ == "HFTokenizer"
    assert (tokenizer.context_length, tokenizer.start_tokens) == (64, 0)
    assert tokenizer(["Red star!"])[0, :3].tolist() == word_ids("red star") + [1]
    assert hub["connections"] == [] and hub["fsspec"] == []


@pytest.mark.parametrize("offline", [True, False], ids=["HF_HUB_OFFLINE", "no-network"])
def test_a_missing_tokenizer_fails_at_once_naming_what_to_get_and_where(hub, monkeypatch, offline):
    if offline:
        monkeypatch.setenv("HF_HUB_OFFLINE", "1")
    start = time.monotonic()
    with pytest.raises(CLIPLoadError) as error:
        Tokenizer("ViT-B-16-SigLIP2")
    assert time.monotonic() - start < 5
    message = str(error.value)
    assert "\n" not in message
    for part in (f"Hugging Face tokenizer '{SIGLIP2_REPO}' (text_cfg.hf_tokenizer_name)",
                 f"(tokenizer.json, tokenizer_config.json) are not in the local Hugging Face cache {hub['cache']} and cannot "
                 "be downloaded now",
                 f'hf download {SIGLIP2_REPO} --include "*.json" --include "tokenizer*"',
                 f"copy the folder models--timm--ViT-B-16-SigLIP2", f"into {hub['cache']} here"):
        assert part in message
    assert ("HF_HUB_OFFLINE=1 is set" in message) == offline
    assert len(hub["connections"]) == (0 if offline else 1) and hub["fsspec"] == []
    with pytest.raises(CLIPLoadError, match="are not in the local Hugging Face cache"):
        check_tokenizer("ViT-B-16-SigLIP2")  # the pre-flight check says the same without loading anything


def test_a_tokenizer_folder_is_read_relative_to_the_model_config(hub, tmp_path, monkeypatch):
    folder = tmp_path / "backbone"
    vocab_size = write_word_tokenizer(str(folder / "tokenizer"), CONTEXT)
    (tmp_path / "elsewhere").mkdir()
    monkeypatch.chdir(tmp_path / "elsewhere")
    for written in ("tokenizer", "./tokenizer"):
        config = write_json(folder / f"tiny-local-tok-{written.strip('./')}{len(written)}.json",
                            siglip_config(written, vocab_size))
        assert check_tokenizer(config).startswith(f"Tokenizer: the local tokenizer folder {folder}")
        assert Tokenizer(config)(["the small cat"])[0, :4].tolist() == word_ids("the small cat") + [1]
    missing = write_json(folder / "tiny-missing-tok.json", siglip_config("./vocab", vocab_size))
    with pytest.raises(CLIPLoadError, match=r"read as the folder \"%s\" \(relative to the model-config JSON's folder\), "
                       r"which does not exist" % (folder / "vocab")):
        Tokenizer(missing)
    assert hub["connections"] == []


def test_a_name_with_siglip_selects_no_tokenizer_and_a_foreign_vocabulary_needs_one(hub, tmp_path):
    """open_clip would give any name with "siglip" SigLIP's sentencepiece tokenizer and fetch its vocabulary
    over HTTP; here the model config decides: no hf_tokenizer_name is CLIP's BPE, which must fit the vocabulary."""
    clip_vocabulary = write_json(tmp_path / "tiny-siglip-bpe-clip.json", FAMILY_TEST_CONFIGS["siglip"])
    tokenizer = Tokenizer(clip_vocabulary)
    assert (tokenizer.start_tokens, tokenizer.special_tokens, tokenizer.context_length) == (1, 2, 32)
    config = copy.deepcopy(FAMILY_TEST_CONFIGS["siglip"])
    config["text_cfg"]["vocab_size"] = 32000
    foreign = write_json(tmp_path / "tiny-siglip-t5-clip.json", config)
    for check in (Tokenizer, check_tokenizer):
        with pytest.raises(CLIPLoadError, match=r"has a text vocabulary of 32000 tokens .* names no tokenizer "
                                                r"\(text_cfg.hf_tokenizer_name\).* sentencepiece tokenizer by the name"):
            check(foreign)
    assert hub["fsspec"] == [] and hub["connections"] == []


FAMILY_NAMES = ("EVA02-", "SigLIP", "PE-Core-", "MetaCLIP", "ViT-B-16", "ViT-L-14")


def test_every_open_clip_model_name_of_the_families_resolves_to_itself():
    names = [name for name in open_clip.list_models() if any(part in name for part in FAMILY_NAMES)]
    assert {"EVA02-B-16", "ViT-B-16-SigLIP2", "ViT-SO400M-14-SigLIP", "PE-Core-T-16-384"} <= set(names)
    for name in names:
        assert resolve_model_name(name) == (name, False)
        assert backbone_config(name).model_cfg == open_clip.get_model_config(name)
    assert resolve_model_name("ViT-B/16") == ("ViT-B-16", True)


@pytest.mark.parametrize("layout", ["flat", "hub"])
def test_a_model_config_json_may_carry_its_preprocess_cfg_in_either_open_clip_layout(tmp_path, layout):
    preprocess = {"mean": [0.5, 0.5, 0.5], "std": [0.5, 0.5, 0.5], "interpolation": "bilinear", "resize_mode": "squash"}
    model_cfg = FAMILY_TEST_CONFIGS["siglip"]
    data = dict(model_cfg, preprocess_cfg=preprocess) if layout == "flat" else \
        {"model_cfg": model_cfg, "preprocess_cfg": preprocess}
    path = write_json(tmp_path / f"tiny-sigmoid-{layout}-clip.json", data)
    config = backbone_config(path)
    assert (config.model_name, config.model_cfg, config.preprocess_cfg) == (f"tiny-sigmoid-{layout}-clip", model_cfg,
                                                                            preprocess)
    model, info = load_clip(path, "random")  # open_clip's model class never sees preprocess_cfg
    assert info["model_name"] == f"tiny-sigmoid-{layout}-clip" and model.logit_bias is not None


@pytest.mark.parametrize("text, expected", [
    ("{not json", "is not readable JSON"),
    ('{"embed_dim": 32, "vision_cfg": {}}', "is not an open_clip model config: expected a JSON object with embed_dim, "
                                            "vision_cfg, text_cfg"),
])
def test_a_json_that_is_no_model_config_is_one_paragraph(tmp_path, text, expected):
    path = tmp_path / "broken-clip.json"
    path.write_text(text, encoding="utf-8")
    with pytest.raises(CLIPLoadError, match=expected):
        load_clip(str(path), "random")


def train_args(tmp_path, *opts):
    return ["--root", str(tmp_path / "no-data"), "--trainer", "CoOp", "--dataset-config-file",
            "configs/datasets/oxford_pets.yaml", "--config-file", "configs/trainers/CoOp/vit_b16_ep50.yaml",
            "--output-dir", str(tmp_path / "run"), "MODEL.BACKBONE.NAME", "ViT-B-16-SigLIP2",
            "MODEL.BACKBONE.WEIGHTS", "webli", *opts]


def test_train_resolves_the_preprocessing_and_finds_the_tokenizer_before_the_data(hub, tmp_path):
    from vlprompt_app.commands.train import build_parser, prepare_backbone, setup_cfg

    cache_siglip2_tokenizer(hub, tmp_path)
    cfg, _ = setup_cfg(build_parser().parse_args(train_args(tmp_path, "INPUT.INTERPOLATION", "bilinear")))
    assert (cfg.INPUT.SIZE, cfg.INPUT.PIXEL_MEAN) == ((), [])  # the merged config leaves them to the backbone
    cfg, notes = prepare_backbone(cfg)
    assert cfg.is_frozen() and (cfg.INPUT.SIZE, cfg.INPUT.INTERPOLATION, cfg.INPUT.PIXEL_MEAN, cfg.INPUT.RESIZE_MODE) \
        == ((224, 224), "bilinear", [0.5, 0.5, 0.5], "squash")
    assert notes[2] == "  INPUT.INTERPOLATION bilinear: set by the config"
    assert notes[3] == "  INPUT.PIXEL_MEAN [0.5, 0.5, 0.5]: open_clip's pretrained config of ViT-B-16-SigLIP2, tag webli"
    assert notes[-1].startswith(f"Tokenizer: Hugging Face tokenizer {SIGLIP2_REPO}, from the local cache")


def test_train_refuses_a_missing_tokenizer_with_one_paragraph_before_any_data_loads(hub, monkeypatch, tmp_path, capsys):
    """The dataset root does not exist, so loading data would fail otherwise: the tokenizer is refused first,
    before the run folder is made (exit status 2, no traceback)."""
    from vlprompt_app.commands import train

    monkeypatch.setenv("HF_HUB_OFFLINE", "1")
    assert train.run(train_args(tmp_path)) == 2
    error = capsys.readouterr().err.strip()
    assert error.startswith(f"Error: The backbone 'ViT-B-16-SigLIP2' tokenizes text with the Hugging Face tokenizer "
                            f"'{SIGLIP2_REPO}'") and "\n" not in error and "Traceback" not in error
    assert not (tmp_path / "run").exists()
