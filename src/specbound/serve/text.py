"""The text a response sends, as a sequence's tokens arrive.

The text of the tokens so far is decoded whole at every step (a token's text can depend on
its neighbours); what is new is sent, except a tail still in doubt: an unfinished character
(the decoder's ``\\ufffd``) or the start of a stop string. A stop string ends the sequence
and is left out of the text, as OpenAI does.
"""

from __future__ import annotations

from collections.abc import Callable


class TextStream:
    """Incremental text of one sequence (module docstring). ``decode``: token ids → text."""

    def __init__(self, decode: Callable[[list[int]], str], stops: tuple[str, ...] = ()):
        self.decode = decode
        self.stops = tuple(stop for stop in stops if stop)
        self.tokens: list[int] = []
        self.sent = 0  # characters already sent
        self.stopped = False

    def push(self, tokens: list[int]) -> str:
        """Add ``tokens``; return the text that is now certain. Sets ``stopped`` when a stop
        string appeared (the text then ends before it)."""
        self.tokens += tokens
        text = self.decode(self.tokens)
        cut = min((index for index in (text.find(stop) for stop in self.stops) if index >= 0), default=-1)
        if cut >= 0:
            self.stopped = True
            return self._send(text, cut)
        safe = len(text) - self._held(text)
        return self._send(text, safe)

    def finish(self) -> str:
        """The rest of the text once the sequence ended (nothing after a stop string)."""
        if self.stopped:
            return ""
        return self._send(self.decode(self.tokens), None)

    def _held(self, text: str) -> int:
        """Characters at the end of ``text`` that may still change or begin a stop string."""
        if text.endswith("\ufffd"):
            return len(text) - len(text.rstrip("\ufffd"))
        longest = 0
        for stop in self.stops:
            for size in range(min(len(stop) - 1, len(text)), longest, -1):
                if text.endswith(stop[:size]):
                    longest = size
                    break
        return longest

    def _send(self, text: str, end: int | None) -> str:
        end = len(text) if end is None else end
        if end <= self.sent:
            return ""
        piece, self.sent = text[self.sent : end], end
        return piece
