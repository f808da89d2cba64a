"""The tiny chat pair the serve tests serve (``specbound serve --pair-factory
support.chat_pair:tiny_pair``): ``specbound.models.tiny.tiny_chat_pair``, with and without EOS."""

from specbound.models.tiny import CHAT_CONTEXT as CONTEXT
from specbound.models.tiny import tiny_chat_pair, tiny_tokenizer

__all__ = ["CONTEXT", "tiny_pair", "tiny_pair_without_eos", "tiny_tokenizer"]


def tiny_pair(eos_token_ids=(0,)):
    return tiny_chat_pair(eos_token_ids)


def tiny_pair_without_eos():
    """The pair with no EOS: every request runs to its max_tokens."""
    return tiny_chat_pair(eos_token_ids=())
