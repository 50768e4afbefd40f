"""CLIP tokenization with a length check instead of silent truncation."""
import torch

from .loading import get_tokenizer_for

__all__ = ["Tokenizer", "PromptTooLongError"]


class PromptTooLongError(ValueError):
    """A sentence does not fit in the text encoder's context length."""


class Tokenizer:
    """Tokenizer of one backbone.

    open_clip truncates sentences that are too long, which would cut the end-of-text
    token and silently change the pooled feature; here such a sentence is an error.

    Args:
        backbone_name: ``MODEL.BACKBONE.NAME``.
    """

    def __init__(self, backbone_name):
        self._tokenizer = get_tokenizer_for(backbone_name)
        self.context_length = self._tokenizer.context_length
        self.sot_token_id = getattr(self._tokenizer, "sot_token_id", None)
        self.eot_token_id = getattr(self._tokenizer, "eot_token_id", None)
        self.start_tokens = self._count_start_tokens()

    def _count_start_tokens(self):
        """Positions every sentence starts with before its first word (CLIP's start-of-text
        token: 1; SigLIP's tokenizers add none: 0): where learnable context tokens go."""
        first, second = (row.tolist() for row in torch.as_tensor(self._tokenizer(["x", "y"])))
        count = 0
        while count < len(first) and first[count] == second[count]:
            count += 1
        return count

    def num_tokens(self, text):
        """Number of BPE tokens of ``text`` without start/end-of-text tokens."""
        return len(self._tokenizer.encode(text))

    def __call__(self, texts, reserve=0):
        """Tokenize a list of sentences.

        Args:
            texts: a string or a list of N strings.
            reserve: positions that must stay free for tokens inserted later (e.g.
                prompt tokens inserted inside the transformer).

        Returns:
            LongTensor [N, context_length].
        """
        texts = [texts] if isinstance(texts, str) else list(texts)
        limit = self.context_length - 2 - reserve
        if hasattr(self._tokenizer, "encode"):
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
