"""The twin's text side: a stand-in tokenizer, a chat template, and the text it "generates".

The twin has no model and no tokenizer, so text becomes token ids by one deterministic rule
(:func:`text_tokens`: every 4 UTF-8 bytes are one token, its id taken from the bytes). Both HTTP
routes use it: a ``/v1/completions`` text prompt and every message of a ``/v1/chat/completions``
request.

The chat template (:func:`render_chat`) is Llama 3's layout with its special token ids::

    <|begin_of_text|> then, per message,
    <|start_header_id|> role <|end_header_id|> "\\n\\n" content <|eot_id|>
    and, to prompt the answer, <|start_header_id|> assistant <|end_header_id|> "\\n\\n"

Each message is tokenized on its own (not the joined text), so a message always becomes the same
tokens wherever it stands: the system prompt and the earlier turns of a conversation are the same
leading tokens at every turn, and a multi-turn chat hits the prefix cache as it does on an engine
whose template is a plain concatenation (Llama 3, Qwen, Mistral; a template that rewrites earlier
turns, such as one that drops old reasoning, would hit less on the engine).

The answer (:func:`answer`): ``n`` words of 4 ASCII bytes (a space and three letters), derived from
the prompt ids, so :func:`text_tokens` of the answer is exactly its ``n`` token ids. A client that
sends the answer back as the assistant message of the next turn therefore sends the very tokens the
engine cached for it (as with a real model, whose tokenizer usually re-encodes its own output to
the same ids), and the next turn hits the previous prompt *and* answer.
"""

from __future__ import annotations

import hashlib
from array import array
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Any

VOCAB = 128_256  # Llama 3 vocabulary
BEGIN_OF_TEXT = 128_000
START_HEADER = 128_006
END_HEADER = 128_007
END_OF_TURN = 128_009  # <|eot_id|>: also the token a model stops on (finish_reason "stop")
DOUBLE_NEWLINE = 271  # "\n\n" in Llama 3's vocabulary
ROLES = ("system", "developer", "user", "assistant", "tool")
_LETTERS = "abcdefghijklmnopqrstuvwxyz"


class ChatError(ValueError):
    """A malformed chat request; ``param`` names the offending field (HTTP 400)."""

    def __init__(self, message: str, param: str) -> None:
        super().__init__(message)
        self.param = param


def text_tokens(text: str) -> list[int]:
    """The stand-in tokenizer: every 4 UTF-8 bytes are one token (its id from the bytes); "" is []."""
    raw = text.encode()
    return [int.from_bytes(raw[i : i + 4], "little") % VOCAB for i in range(0, len(raw), 4)]


_WORD_CHARS = "ABCDEFGHIJKLMNOPQRSTUVWXYZabcdefghijklmnopqrstuvwxyz0123456789-_"


def ids_text(ids: Sequence[int]) -> str:
    """A text for token ids, 4 ASCII bytes per id (three base-64 digits of the id and ``.``), so that
    texts of id sequences share exactly the prefixes the sequences share, in characters (what a
    router's prefix tree compares) and, through :func:`text_tokens`, in tokens (what the twin
    caches): ``text_tokens(ids_text(ids))`` is one id per id. Distinct ids can map to one token (4
    ASCII bytes reach about 64 * 64 * 64 of the vocabulary's residues); that never splits a shared
    prefix, and two requests that diverge after the same tokens merge for one more token rarely."""
    chars = _WORD_CHARS
    return "".join(chars[t & 63] + chars[(t >> 6) & 63] + chars[(t >> 12) & 63] + "." for t in ids)


_TEXT_IDS: list[int] = []  # id -> the twin's id of its 4-character text (built on first use)


def text_ids(ids: Sequence[int]) -> list[int]:
    """The token ids the twin reads from ``ids_text(ids)`` (``text_tokens`` of it), by table: a
    client can send these ids instead of the text and the engine caches the very same tokens."""
    table = _TEXT_IDS
    if not table:
        table.extend(text_tokens(ids_text(range(VOCAB))))
    return [table[t] for t in ids]


@dataclass(frozen=True)
class Message:
    role: str
    content: str


def parse_messages(messages: Any) -> list[Message]:
    """The ``messages`` of a chat request, checked. Content is a string, null (an assistant turn
    with tool calls), or a list of ``{"type": "text", "text": ...}`` parts (joined by newlines,
    as vLLM does); other part types (images, audio) are refused."""
    if not isinstance(messages, list) or not messages:
        raise ChatError("messages must be a non-empty list of {role, content} objects", "messages")
    out: list[Message] = []
    for i, m in enumerate(messages):
        where = f"messages[{i}]"
        if not isinstance(m, Mapping):
            raise ChatError(f"{where} must be an object with role and content", where)
        role = m.get("role")
        if role not in ROLES:
            raise ChatError(f"{where}.role must be one of {', '.join(ROLES)}; got {role!r}", f"{where}.role")
        out.append(Message(str(role), _content(m.get("content"), f"{where}.content")))
    return out


def _content(content: Any, where: str) -> str:
    if content is None:
        return ""
    if isinstance(content, str):
        return content
    if isinstance(content, list):
        texts: list[str] = []
        for j, part in enumerate(content):
            if (
                not isinstance(part, Mapping)
                or part.get("type") != "text"
                or not isinstance(part.get("text"), str)
            ):
                kind = part.get("type") if isinstance(part, Mapping) else type(part).__name__
                raise ChatError(
                    f"{where}[{j}]: only text content parts are supported by the twin; got {kind!r}",
                    f"{where}[{j}]",
                )
            texts.append(part["text"])
        return "\n".join(texts)
    raise ChatError(f"{where} must be a string, a list of text parts, or null", where)


def header_tokens(role: str) -> list[int]:
    return [START_HEADER, *text_tokens(role), END_HEADER, DOUBLE_NEWLINE]


def message_tokens(message: Message) -> list[int]:
    return [*header_tokens(message.role), *text_tokens(message.content), END_OF_TURN]


def render_chat(messages: Sequence[Message], add_generation_prompt: bool = True) -> list[int]:
    """The prompt token ids of a conversation (see the module doc)."""
    tokens = [BEGIN_OF_TEXT]
    for m in messages:
        tokens += message_tokens(m)
    if add_generation_prompt:
        tokens += header_tokens("assistant")
    return tokens


def answer(prompt: Sequence[int], n: int) -> tuple[str, list[int]]:
    """The twin's answer to ``prompt``: ``n`` four-byte words and their token ids (a deterministic
    function of the prompt, as greedy decoding is). Token ``i`` is ``text[4 * i : 4 * i + 4]``."""
    digest = hashlib.blake2b(array("q", prompt).tobytes(), digest_size=8).digest()
    state = int.from_bytes(digest, "little")
    words: list[str] = []
    for i in range(n):
        x = (state + (i + 1) * 0x9E3779B97F4A7C15) & 0xFFFF_FFFF_FFFF_FFFF
        x = (x ^ (x >> 29)) * 0xBF58476D1CE4E5B9 & 0xFFFF_FFFF_FFFF_FFFF
        words.append(" " + _LETTERS[x % 26] + _LETTERS[(x >> 8) % 26] + _LETTERS[(x >> 16) % 26])
    text = "".join(words)
    return text, text_tokens(text)
