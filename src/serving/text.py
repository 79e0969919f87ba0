"""A request's new tokens as text, piece by piece: what each token adds to the decoded whole (a character cut
between two tokens is held back until it is whole), and where a stop string ends it (the text before it)."""

from __future__ import annotations


class Detokenizer:
    def __init__(self, tokenizer, stop: list[str]):
        self.tokenizer, self.stop = tokenizer, stop
        self.tokens: list[int] = []
        self.sent = ""  # the text given out so far
        self.stopped = False

    def add(self, token: int | None) -> str:
        """The text `token` adds (None: the end; what was held back). Sets `stopped` at a stop string."""
        if token is not None:
            self.tokens.append(token)
        text = self.tokenizer.decode(self.tokens, skip_special_tokens=True)
        if token is not None and text.endswith("\ufffd"):  # half a character: wait for the rest
            return ""
        for s in self.stop:
            at = text.find(s)
            if at >= 0:
                text, self.stopped = text[:at], True
        if not self.stopped and token is not None:  # a stop string may be starting: hold its first characters back
            keep = max((k for s in self.stop for k in range(1, len(s)) if text.endswith(s[:k])), default=0)
            text = text[: len(text) - keep]
        new = text[len(self.sent) :] if text.startswith(self.sent) else ""
        self.sent += new
        return new
