"""Token ids -> text for one generation: EOS, stop strings, and pieces safe to show as they come.

TextStream takes each step's accepted tokens and returns the new text piece and whether the generation is
over. It holds back the tail that could still become a stop string and a character split across tokens
(a trailing U+FFFD), so a piece once given is never taken back. The solo decode loop and the batching
engine both use it; nothing here knows about models.
"""
from __future__ import annotations


class TextStream:
    def __init__(self, tokenizer, eos: set, stops: tuple, max_new_tokens: int, generation):
        self.tokenizer, self.eos, self.max_new = tokenizer, eos, max_new_tokens
        self.stops = tuple(s for s in stops if s)
        self.hold = max((len(s) for s in self.stops), default=1) - 1  # what could start a stop string
        self.g = generation
        self.g.token_ids, self.g.text, self.g.finish_reason = [], "", "length"
        self.sent = 0

    def push(self, new: list[int]) -> tuple[str, bool]:
        """Add one step's tokens -> (text piece to show now, finished)."""
        g = self.g
        for t in new:
            if len(g.token_ids) >= self.max_new:
                break
            g.token_ids.append(t)
            if t in self.eos:
                g.finish_reason = "eos"
                break
        text = self.tokenizer.decode([t for t in g.token_ids if t not in self.eos])
        cut = min((i for i in (text.find(s) for s in self.stops) if i >= 0), default=-1)
        if cut >= 0:
            text, g.finish_reason = text[:cut], "stop"
        g.text = text
        done = g.finish_reason != "length" or len(g.token_ids) >= self.max_new
        end = len(text) if done else len(text) - self.hold
        if text.endswith("\ufffd") and not done:  # a character split across tokens: wait for the rest
            end = min(end, len(text) - 1)
        piece = ""
        if end > self.sent:
            piece, self.sent = text[self.sent:end], end
        if done:
            g.stats.new_tokens = len(g.token_ids)  # delivered: a step may accept tokens past the EOS or stop
        return piece, done
