"""Turn a request's token deltas into text deltas, honouring stop strings.

While stop strings are set, the last ``len(longest stop) - 1`` characters are held back, since
they may be the start of a stop string that the next tokens complete (as vLLM does).
"""

from __future__ import annotations

from collections.abc import Sequence

from kvgate.wire.tokenizer import IncrementalDecoder


class TextStream:
    def __init__(self, decoder: IncrementalDecoder, stop: tuple[str, ...] = ()) -> None:
        self._decoder = decoder
        self._stop = stop
        self._holdback = max((len(s) for s in stop), default=1) - 1
        self._pending = ""
        self.stopped = False

    def feed(self, token_ids: Sequence[int], final: bool = False) -> str:
        """Text that is safe to emit after ``token_ids``; sets ``stopped`` on a stop string."""
        if not self._stop:
            return self._decoder.decode(token_ids, final=final)
        if self.stopped:
            return ""
        text = self._pending + self._decoder.decode(token_ids, final=final)
        if self._stop:
            cut = min((i for i in (text.find(s) for s in self._stop) if i >= 0), default=-1)
            if cut >= 0:
                self.stopped = True
                self._pending = ""
                return text[:cut]
        if final or not self._holdback:
            self._pending = ""
            return text
        keep = min(self._holdback, len(text))
        self._pending = text[len(text) - keep :]
        return text[: len(text) - keep]
