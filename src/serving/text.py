"""A request's new tokens as text, piece by piece: what each token adds to the decoded whole (a character cut
between two tokens is held back until it is whole), and where a stop string ends it (the text before it).

Each token costs time bounded by the stop strings' length, not by the text so far: a token's text is decoded
from a window of the last few tokens (the window's text before it, then with it: the difference is what it
adds, as vLLM's incremental detokenizer does), a stop string is searched for only where it could newly end, and
what is held back is at most the longest stop string less one character."""

from __future__ import annotations


class Detokenizer:
    def __init__(self, tokenizer, stop: list[str]):
        self.tokenizer, self.stop = tokenizer, stop
        self.longest = max((len(s) for s in stop), default=0)
        self.tokens: list[int] = []
        self.prefix = self.read = 0  # the window: tokens[prefix:read] are decoded as context for what follows
        self.text = ""  # every whole character decoded so far
        self.sent = ""  # the text given out so far (a prefix of `text`)
        self.stopped = False

    def _decode(self, tokens: list[int]) -> str:
        return self.tokenizer.decode(tokens, skip_special_tokens=True)

    def _grow(self, end: bool) -> None:
        """Append to `text` what the tokens after the window add, once they end on a whole character (at the
        end, whatever they add)."""
        if self.read == len(self.tokens):
            return
        before = self._decode(self.tokens[self.prefix : self.read])
        after = self._decode(self.tokens[self.prefix :])
        if len(after) > len(before) and (end or not after.endswith("\ufffd")):
            self.text += after[len(before) :]
            self.prefix, self.read = self.read, len(self.tokens)

    def add(self, token: int | None) -> str:
        """The text `token` adds (None: the end; what was held back). Sets `stopped` at a stop string."""
        if self.stopped:
            return ""
        if token is not None:
            self.tokens.append(token)
        old = len(self.text)
        self._grow(end=token is None)
        # a stop string can newly end only where it overlaps what this token added
        start = max(0, old - self.longest + 1)
        for s in self.stop:
            at = self.text.find(s, start)
            if at >= 0:
                self.text, self.stopped = self.text[:at], True
                start = min(start, at)
        text = self.text
        if not self.stopped and token is not None and self.stop:  # a stop string may be starting: hold it back
            tail = text[-self.longest :]
            keep = max((k for s in self.stop for k in range(1, len(s)) if tail.endswith(s[:k])), default=0)
            text = text[: len(text) - keep]
        new = text[len(self.sent) :] if len(text) > len(self.sent) else ""
        self.sent += new
        return new
