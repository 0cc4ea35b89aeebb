"""The simulated model's tokenizer: words and punctuation in, a small vocabulary out.

Prompt tokens are words and punctuation marks (`\\w+|[^\\w\\s]`), each mapped to a stable id (CRC-32,
never Python's salted `hash`), so the same text always has the same ids and a shared prefix shares
its KV-cache blocks. Output tokens are ids into `VOCAB`, one word each, decoded with a leading space.
"""

from __future__ import annotations

import re
import zlib
from collections.abc import Sequence
from typing import Any

VOCAB = tuple(
    """
the of and to in is was for on that with as by at from it an be this which or are were has have
engine token stream batch cache block queue step prefill decode kernel graph worker request model
tensor layer head weight signal event broadcast ring buffer memory device host node cluster shard
scheduler sampler draft accept reject verify output input prompt context window latency throughput
fast slow steady warm cold early late first last next every each some many few all none more less
""".split()
)
VOCAB_SIZE = 50_000  # the id space of prompt tokens
BOS_ID = 1
EOS_ID = 2

_WORD = re.compile(r"\w+|[^\w\s]")


def text_to_ids(text: str) -> list[int]:
    return [3 + zlib.crc32(w.encode()) % (VOCAB_SIZE - 3) for w in _WORD.findall(text)]


def prompt_ids(prompt: Any) -> list[int]:
    """Token ids of a completions `prompt`: a string, or a list of token ids (BOS first for text)."""
    if isinstance(prompt, str):
        return [BOS_ID] + text_to_ids(prompt)
    if isinstance(prompt, list) and prompt and all(isinstance(t, int) and not isinstance(t, bool) for t in prompt):
        return list(prompt)
    raise ValueError("prompt must be a string or a list of token ids")


def chat_ids(messages: Any) -> list[int]:
    """Token ids of a chat conversation under a simple template (`<|role|> content` per message)."""
    if not isinstance(messages, list) or not messages:
        raise ValueError("messages must be a non-empty list")
    ids = [BOS_ID]
    for m in messages:
        if not isinstance(m, dict) or "role" not in m:
            raise ValueError("each message needs a role")
        content = m.get("content") or ""
        if isinstance(content, list):  # OpenAI content parts
            content = " ".join(p.get("text", "") for p in content if isinstance(p, dict))
        ids += text_to_ids(f"<|{m['role']}|>") + text_to_ids(str(content))
    return ids + text_to_ids("<|assistant|>")


def detokenize(ids: Sequence[int]) -> str:
    return "".join(" " + VOCAB[i % len(VOCAB)] for i in ids)
