"""Small Hugging Face tokenizers and a local Hugging Face hub cache, written offline for tests.

``write_word_tokenizer`` saves a ``tokenizers`` WordLevel tokenizer as SigLIP's are used (no start
token, the end-of-sentence token appended, padded to the context length) into a folder;
``write_hub_snapshot`` lays files out as huggingface_hub's cache holds a downloaded repository
(``models--org--name/refs/main`` naming a commit, ``snapshots/<commit>/<files>``), so that
``huggingface_hub.try_to_load_from_cache`` and transformers' ``local_files_only`` loads find them.
"""
import json
import os

WORDS = ("a", "photo", "of", "the", "dog", "cat", "red", "star", "small", "striped", "hexagon", "itap", "very",
         "x", "y", "big", "blue")
PAD, EOS, UNK = "<pad>", "</s>", "<unk>"
COMMIT = "0123456789abcdef0123456789abcdef01234567"


def write_word_tokenizer(folder, context_length, words=WORDS):
    """Save a WordLevel tokenizer (ids: <pad> 0, </s> 1, <unk> 2, then ``words``) as ``folder/tokenizer.json``.

    Returns:
        the vocabulary size.
    """
    from tokenizers import Tokenizer, models, normalizers, pre_tokenizers, processors

    vocab = {token: index for index, token in enumerate((PAD, EOS, UNK, *words))}
    tokenizer = Tokenizer(models.WordLevel(vocab, unk_token=UNK))
    tokenizer.normalizer = normalizers.Lowercase()
    tokenizer.pre_tokenizer = pre_tokenizers.Whitespace()
    tokenizer.post_processor = processors.TemplateProcessing(single=f"$A {EOS}", special_tokens=[(EOS, vocab[EOS])])
    tokenizer.enable_padding(length=context_length, pad_id=vocab[PAD], pad_token=PAD)
    os.makedirs(folder, exist_ok=True)
    tokenizer.save(os.path.join(folder, "tokenizer.json"))
    return len(vocab)


def write_hub_snapshot(cache_dir, repo_id, source_folder, extra=None):
    """Put the files of ``source_folder`` (and ``extra``: {file name: JSON data}) into the hub cache
    ``cache_dir`` as the snapshot of model repository ``repo_id``; returns the snapshot folder."""
    repo = os.path.join(cache_dir, "models--" + repo_id.replace("/", "--"))
    snapshot = os.path.join(repo, "snapshots", COMMIT)
    os.makedirs(snapshot, exist_ok=True)
    os.makedirs(os.path.join(repo, "refs"), exist_ok=True)
    with open(os.path.join(repo, "refs", "main"), "w", encoding="utf-8") as f:
        f.write(COMMIT)
    for name in os.listdir(source_folder):
        with open(os.path.join(source_folder, name), "rb") as src, open(os.path.join(snapshot, name), "wb") as dst:
            dst.write(src.read())
    for name, data in (extra or {}).items():
        with open(os.path.join(snapshot, name), "w", encoding="utf-8") as f:
            json.dump(data, f)
    return snapshot
