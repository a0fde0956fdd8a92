"""One inference request as the twin sees it."""

from __future__ import annotations

from dataclasses import dataclass

from prefixtune.twin.prompt import TokenSeq


@dataclass(frozen=True)
class Request:
    """A request: when it arrives, its prompt, and how many tokens it will generate.

    ``seq`` is the identity of the prompt *followed by the output*: its first ``prompt_len`` tokens
    are the prompt and the next ``output_len`` tokens are what the engine generates. Giving the
    output an identity lets the next turn of a conversation (whose prompt contains this output)
    hit the blocks this request cached, as in the engines.
    """

    req_id: int
    arrival_s: float
    seq: TokenSeq
    prompt_len: int
    output_len: int
    session: int | None = None
    kind: str = ""  # the workload class it came from (for reports), e.g. "rag", "new-session"

    def __post_init__(self) -> None:
        if self.prompt_len < 1:
            raise ValueError("a request needs at least one prompt token")
        if self.output_len < 1:
            raise ValueError("a request generates at least one token")
        if self.seq.length < self.prompt_len:
            raise ValueError("seq is shorter than the prompt")

    @property
    def prompt(self) -> TokenSeq:
        return self.seq.truncate(self.prompt_len)
