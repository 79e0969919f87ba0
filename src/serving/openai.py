"""OpenAI's completions and chat completions, as src.serving's server reads and answers them: a request body to
a Completion (or BadRequest, one line saying what to send instead), and the JSON it sends back, whole or as
server-sent-event chunks. The fields a load generator or an OpenAI client sends are read; `n` above 1, `logprobs`
and `echo` are refused in one line rather than ignored."""

from __future__ import annotations

import json
import math
import time
import uuid
from dataclasses import dataclass, field

from src.data.prompts import templated
from src.engine.config import MIN_TEMPERATURE, Sampling

DEFAULT_MAX_TOKENS = 16  # OpenAI's default for completions


class BadRequest(Exception):
    """A request that cannot be served: its HTTP status and one line saying why and what to do."""

    def __init__(self, message: str, status: int = 400):
        super().__init__(message)
        self.status = status


@dataclass
class Completion:
    """One request, read: its prompt as token ids and how to generate after it."""

    chat: bool
    prompt_ids: list[int]
    max_tokens: int
    sampling: Sampling
    stream: bool
    stop: list[str] = field(default_factory=list)
    ignore_eos: bool = False
    include_usage: bool = False
    id: str = field(default_factory=lambda: uuid.uuid4().hex[:24])
    created: int = field(default_factory=lambda: int(time.time()))


def read(body: bytes, chat: bool, tokenizer, max_context: int) -> Completion:
    """The request in `body` (JSON), or BadRequest."""
    try:
        req = json.loads(body)
    except (ValueError, UnicodeDecodeError) as e:
        raise BadRequest(f"the body is not JSON ({e}); send a JSON object as OpenAI's API takes") from None
    if not isinstance(req, dict):
        raise BadRequest("the body must be a JSON object with the request's fields")
    ids = _chat_ids(req, tokenizer) if chat else _prompt_ids(req, tokenizer)
    if not ids:
        raise BadRequest("the prompt is empty: send at least one token of text")
    for name in ("n", "best_of"):
        if req.get(name) not in (None, 1):
            raise BadRequest(f"{name}={req[name]!r}: this server generates one choice a request; send {name}=1")
    for name in ("logprobs", "echo", "top_logprobs"):
        if req.get(name) not in (None, False, 0):
            raise BadRequest(f"{name} is not supported by this server; leave it out")
    room = max_context - len(ids)
    asked = req.get("max_completion_tokens", req.get("max_tokens"))
    if asked is None:
        max_tokens = min(DEFAULT_MAX_TOKENS, room) if not chat else room
    elif not isinstance(asked, int) or isinstance(asked, bool) or asked < 1:
        raise BadRequest(f"max_tokens={asked!r} must be a positive integer")
    else:
        max_tokens = asked
    if room < 1 or max_tokens > room:
        raise BadRequest(
            f"the prompt ({len(ids)} tokens) and max_tokens ({max_tokens}) exceed the model's context of "
            f"{max_context} tokens; shorten the prompt or ask for at most {max(room, 0)} tokens"
        )
    stop = req.get("stop") or []
    stop = [stop] if isinstance(stop, str) else stop
    if not isinstance(stop, list) or not all(isinstance(s, str) and s for s in stop):
        raise BadRequest("stop must be a string or a list of non-empty strings")
    options = req.get("stream_options") or {}
    stream = req.get("stream", False)
    if not isinstance(stream, bool):
        raise BadRequest(f"stream={stream!r} must be true or false")
    return Completion(
        chat,
        ids,
        max_tokens,
        _sampling(req),
        stream,
        stop,
        bool(req.get("ignore_eos", False)),
        bool(isinstance(options, dict) and options.get("include_usage")),
    )


def _number(req: dict, name: str, default: float) -> float:
    value = req.get(name, default)
    if value is None:
        return default
    if isinstance(value, bool) or not isinstance(value, (int, float)) or not math.isfinite(value):
        raise BadRequest(f"{name}={value!r} must be a number")
    return float(value)


def _sampling(req: dict) -> Sampling:
    temperature, top_p = _number(req, "temperature", 1.0), _number(req, "top_p", 1.0)
    seed = req.get("seed")
    if seed is not None and (isinstance(seed, bool) or not isinstance(seed, int)):
        raise BadRequest(f"seed={seed!r} must be an integer")
    if temperature < 0 or not 0 < top_p <= 1:
        raise BadRequest(f"temperature={temperature} must be >= 0 and top_p={top_p} in (0, 1]")
    if temperature < MIN_TEMPERATURE:  # 0: greedy, as OpenAI's API reads it
        return Sampling()
    return Sampling(do_sample=True, temperature=temperature, top_p=top_p, seed=seed if seed is not None else 0)


def _prompt_ids(req: dict, tokenizer) -> list[int]:
    prompt = req.get("prompt")
    if isinstance(prompt, list) and len(prompt) == 1 and isinstance(prompt[0], (str, list)):
        prompt = prompt[0]  # a batch of one
    if isinstance(prompt, str):
        return list(tokenizer(prompt).input_ids)
    if isinstance(prompt, list) and all(isinstance(t, int) and not isinstance(t, bool) for t in prompt):
        vocab = len(tokenizer)
        bad = [t for t in prompt if not 0 <= t < vocab]
        if bad:
            raise BadRequest(f"token id {bad[0]} is outside the vocabulary of {vocab}")
        return list(prompt)
    raise BadRequest("prompt must be a string or a list of token ids (one prompt a request)")


def _chat_ids(req: dict, tokenizer) -> list[int]:
    messages = req.get("messages")
    if not isinstance(messages, list) or not messages:
        raise BadRequest('messages must be a non-empty list of {"role": ..., "content": ...}')
    chat = []
    for i, m in enumerate(messages):
        content = m.get("content") if isinstance(m, dict) else None
        if isinstance(content, list):  # content parts: the text ones, joined
            content = "".join(p.get("text", "") for p in content if isinstance(p, dict) and p.get("type") == "text")
        if not isinstance(m, dict) or not isinstance(m.get("role"), str) or not isinstance(content, str):
            raise BadRequest(f'messages[{i}] must be {{"role": a string, "content": a string}}')
        chat.append({"role": m["role"], "content": content})
    if templated(tokenizer):
        try:
            ids = tokenizer.apply_chat_template(chat, add_generation_prompt=True, tokenize=True)
        except Exception as e:  # noqa: BLE001 - a template's own rules (roles that must alternate): its words
            raise BadRequest(f"the model's chat template refuses these messages: {e}") from None
        return list(ids["input_ids"] if hasattr(ids, "keys") else ids)
    text = "".join(f"{m['role']}: {m['content']}\n" for m in chat) + "assistant:"
    return list(tokenizer(text).input_ids)


def _usage(done: Completion, tokens: int) -> dict:
    prompt = len(done.prompt_ids)
    return {"prompt_tokens": prompt, "completion_tokens": tokens, "total_tokens": prompt + tokens}


def whole(c: Completion, model: str, text: str, finish: str, tokens: int) -> dict:
    """The answer to a request that did not stream."""
    if c.chat:
        choice = {"index": 0, "message": {"role": "assistant", "content": text}, "finish_reason": finish}
        kind = "chat.completion"
    else:
        choice = {"index": 0, "text": text, "finish_reason": finish, "logprobs": None}
        kind = "text_completion"
    return {
        "id": _id(c),
        "object": kind,
        "created": c.created,
        "model": model,
        "choices": [choice],
        "usage": _usage(c, tokens),
    }


def chunk(c: Completion, model: str, text: str, finish: str | None, first: bool = False) -> dict:
    """One server-sent event's data while streaming."""
    if c.chat:
        delta = {"role": "assistant", "content": text} if first else {"content": text} if text else {}
        choice, kind = {"index": 0, "delta": delta, "finish_reason": finish}, "chat.completion.chunk"
    else:
        choice, kind = {"index": 0, "text": text, "finish_reason": finish, "logprobs": None}, "text_completion"
    return {"id": _id(c), "object": kind, "created": c.created, "model": model, "choices": [choice]}


def usage_chunk(c: Completion, model: str, tokens: int) -> dict:
    kind = "chat.completion.chunk" if c.chat else "text_completion"
    return {
        "id": _id(c),
        "object": kind,
        "created": c.created,
        "model": model,
        "choices": [],
        "usage": _usage(c, tokens),
    }


def error(message: str, status: int) -> dict:
    kind = {400: "invalid_request_error", 404: "not_found_error", 413: "invalid_request_error"}.get(
        status, "server_error"
    )
    return {"error": {"message": message, "type": kind, "code": status}}


def _id(c: Completion) -> str:
    return ("chatcmpl-" if c.chat else "cmpl-") + c.id
