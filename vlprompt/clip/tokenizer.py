"""CLIP tokenization with a length check instead of silent truncation."""
import torch

from .tokenizer_files import get_tokenizer_for

__all__ = ["Tokenizer", "PromptTooLongError"]


class PromptTooLongError(ValueError):
    """A sentence does not fit in the text encoder's context length."""


def _text_encoder(tokenizer):
    """(encode, special_tokens) of an open_clip tokenizer: ``encode(text)`` gives the token ids of
    ``text`` alone, cleaned as the tokenizer's ``__call__`` cleans it and without special tokens;
    ``special_tokens`` is how many the tokenizer adds to every sentence (CLIP's start and end of
    text: 2; SigLIP's end of sentence: 1).

    Raises:
        TypeError: a tokenizer of another kind (its length could not be checked).
    """
    from open_clip.tokenizer import HFTokenizer, SimpleTokenizer

    if isinstance(tokenizer, SimpleTokenizer):
        return (lambda text: tokenizer.encode(tokenizer.clean_fn(text))), 2
    if isinstance(tokenizer, HFTokenizer):
        if tokenizer.tokenizer_mode:
            raise TypeError(f"open_clip's HFTokenizer in mode {tokenizer.tokenizer_mode!r} is not supported: its "
                            "sentences are cut and padded by open_clip itself, so their length cannot be checked.")
        backend = tokenizer.tokenizer

        def encode(text, special=False):
            ids = backend(tokenizer.clean_fn(text), add_special_tokens=special, padding=False, truncation=False)
            return list(ids["input_ids"])

        return encode, len(encode("a", special=True)) - len(encode("a"))
    raise TypeError(f"open_clip tokenizer {type(tokenizer).__name__} is not supported (its length cannot be checked).")


class Tokenizer:
    """Tokenizer of one backbone (CLIP's BPE tokenizer or a Hugging Face tokenizer, as its model
    config names it: :mod:`vlprompt.clip.tokenizer_files`).

    open_clip truncates sentences that are too long, which would cut the end-of-text
    token and silently change the pooled feature; here such a sentence is an error.

    Args:
        backbone_name: ``MODEL.BACKBONE.NAME``.

    Attributes:
        context_length: positions of a tokenized sentence.
        special_tokens: tokens the tokenizer adds to every sentence (2 for CLIP, 1 for SigLIP).
        start_tokens: positions before a sentence's first word (CLIP's start-of-text token: 1;
            SigLIP's tokenizers add none: 0): where learnable context tokens go.
    """

    def __init__(self, backbone_name):
        self._tokenizer = get_tokenizer_for(backbone_name)
        self.context_length = self._tokenizer.context_length
        self.sot_token_id = getattr(self._tokenizer, "sot_token_id", None)
        self.eot_token_id = getattr(self._tokenizer, "eot_token_id", None)
        self._encode, self.special_tokens = _text_encoder(self._tokenizer)
        self.start_tokens = self._count_start_tokens()

    def _count_start_tokens(self):
        """Where the words of a sentence start in its tokenized row (the first position at which the
        ids of the words alone appear)."""
        text = "a photo of a dog."
        words = self._encode(text)
        row = torch.as_tensor(self._tokenizer([text]))[0].tolist()
        for start in range(len(row) - len(words) + 1):
            if row[start:start + len(words)] == words:
                return start
        raise ValueError(f"The tokenizer's row {row} does not contain the ids {words} of {text!r} alone.")

    def num_tokens(self, text):
        """Number of tokens of ``text`` without the tokenizer's special (start/end) tokens."""
        return len(self._encode(text))

    def __call__(self, texts, reserve=0):
        """Tokenize a list of sentences.

        Args:
            texts: a string or a list of N strings.
            reserve: positions that must stay free for tokens inserted later (e.g.
                prompt tokens inserted inside the transformer).

        Returns:
            LongTensor [N, context_length].

        Raises:
            PromptTooLongError: a sentence, with the special tokens and ``reserve``, does not fit.
        """
        texts = [texts] if isinstance(texts, str) else list(texts)
        limit = self.context_length - self.special_tokens - reserve
        for text in texts:
            n = self.num_tokens(text)
            if n > limit:
                raise PromptTooLongError(
                    f'The sentence "{text}" has {n} tokens; at most {limit} fit in the context '
                    f"length {self.context_length}"
                    + (f" when {reserve} positions are reserved for inserted prompt tokens" if reserve else "")
                    + ". Shorten the template or the class name."
                )
        return torch.as_tensor(self._tokenizer(texts), dtype=torch.long)
