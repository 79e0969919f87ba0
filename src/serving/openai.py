"""OpenAI's completions and chat completions, as src.serving's server reads and answers them: a request body to
a Completion (or BadRequest, one line saying what to send instead), and the JSON it sends back, whole or as
server-sent-event chunks. The fields a load generator or an OpenAI client sends are read; `n` above 1, `logprobs`,
`echo`, an unknown field, and one that would change the answer at other than its neutral value (`top_k`,
`presence_penalty`, `response_format`, ...: NEUTRAL) are refused in one line rather than ignored; a `model` other
than the one served is not found (404, code model_not_found), and a request that names none gets it."""

from __future__ import annotations

import json
import math
import secrets
import time
import uuid
from dataclasses import dataclass, field

from src.common.say import message_line
from src.data.prompts import TemplateTooCostly, max_chars, render_chat, templated
from src.engine.config import MIN_TEMPERATURE, Sampling

DEFAULT_MAX_TOKENS = 16  # OpenAI's default for completions (a chat's is the server's setting)
MAX_STOPS = 4  # stop strings a request may send (OpenAI's limit)
MAX_STOP_CHARS = 256  # characters in one stop string: each is matched against the text held back at every token
SEED_RANGE = (-(1 << 63), (1 << 64) - 1)  # what torch.Generator.manual_seed takes
# The fields this server reads (the others below refused where they would change the answer), and those that say
# nothing about the answer (OpenAI's end-user id, its stored-completion metadata): read and left.
READ = {
    "model", "prompt", "messages", "max_tokens", "max_completion_tokens", "temperature", "top_p", "n", "best_of",
    "stream", "stream_options", "stop", "seed", "ignore_eos", "logprobs", "echo", "top_logprobs",
}  # fmt: skip
NO_EFFECT = {"user", "metadata", "store"}
# Fields that change the answer, served only at the value that leaves it as this server gives it.
NEUTRAL = {
    "presence_penalty": (0, 0.0),
    "frequency_penalty": (0, 0.0),
    "repetition_penalty": (1, 1.0),
    "top_k": (-1, 0),
    "min_p": (0, 0.0),
    "min_tokens": (0,),
    "logit_bias": ({},),
    "response_format": ({"type": "text"},),
    "tools": ([],),
    "tool_choice": ("none",),
}


class BadRequest(Exception):
    """A request that cannot be served: its HTTP status and one line saying why and what to do."""

    def __init__(self, message: str, status: int = 400, code: str | None = None, param: str | None = None):
        super().__init__(message)
        self.status, self.code, self.param = status, code, param


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


@dataclass(frozen=True)
class Limits:
    """What a request may ask of the server: its context, the new tokens of one that names none, and the model
    names it answers to (empty: any; a request that names no model gets the one served, as llama-server does)."""

    max_context: int
    default_max_tokens: int = 256
    models: tuple[str, ...] = ()


def read(body: bytes, chat: bool, tokenizer, limits: Limits | int) -> Completion:
    """The request in `body` (JSON), or BadRequest. Every field is checked before the request joins the batch,
    so nothing it brings can fail a step that other requests share; anything unforeseen in reading it is a
    BadRequest too, with its type and first line."""
    limits = limits if isinstance(limits, Limits) else Limits(limits)
    try:
        return _read(body, chat, tokenizer, limits)
    except BadRequest:
        raise
    except RecursionError:
        raise BadRequest("the body nests too deeply to read; send a flat JSON object as OpenAI's API takes") from None
    except Exception as e:  # noqa: BLE001 - a field's shape this reader did not foresee: still one line, 400
        raise BadRequest(
            f"the request could not be read ({type(e).__name__}: {message_line(e)}); check its fields"
        ) from None


def _read(body: bytes, chat: bool, tokenizer, limits: Limits) -> Completion:
    try:
        req = json.loads(body)
    except (ValueError, UnicodeDecodeError) as e:
        raise BadRequest(f"the body is not JSON ({e}); send a JSON object as OpenAI's API takes") from None
    if not isinstance(req, dict):
        raise BadRequest("the body must be a JSON object with the request's fields")
    unknown = sorted(k for k in req if k not in READ | NO_EFFECT | set(NEUTRAL))
    if unknown:
        raise BadRequest(
            f"unknown parameter{'s' if len(unknown) > 1 else ''} {', '.join(map(repr, unknown))[:200]}: this server "
            f"reads {', '.join(sorted(READ))}; leave {'them' if len(unknown) > 1 else 'it'} out"
        )
    model = req.get("model")
    if model is not None and not isinstance(model, str):
        raise BadRequest(f"model={json.dumps(model)[:80]} must be a string: the name GET /v1/models lists")
    if model is not None and limits.models and model not in limits.models:
        raise BadRequest(
            f"the model {model!r} does not exist on this server: it serves {', '.join(map(repr, limits.models))} "
            "(GET /v1/models)",
            404,
            code="model_not_found",
            param="model",
        )
    for name, fine in NEUTRAL.items():
        if req.get(name) is not None and not any(req[name] == v and type(req[name]) is type(v) for v in fine):
            raise BadRequest(
                f"{name}={json.dumps(req[name])[:80]} is not supported by this server (it serves only "
                f"{json.dumps(fine[0])}); leave it out"
            )
    for name in ("n", "best_of"):
        if req.get(name) not in (None, 1):
            raise BadRequest(f"{name}={req[name]!r}: this server generates one choice a request; send {name}=1")
    for name in ("logprobs", "echo", "top_logprobs"):
        if req.get(name) not in (None, False, 0):
            raise BadRequest(f"{name} is not supported by this server; leave it out")
    stop = _stop(req.get("stop"))
    sampling = _sampling(req)
    stream = req.get("stream", False)
    if not isinstance(stream, bool):
        raise BadRequest(f"stream={stream!r} must be true or false")
    options = req.get("stream_options") or {}
    if not isinstance(options, dict):
        raise BadRequest('stream_options must be an object, e.g. {"include_usage": true}')
    ignore_eos = req.get("ignore_eos", False)
    if not isinstance(ignore_eos, bool):
        raise BadRequest(f"ignore_eos={ignore_eos!r} must be true or false")
    asked = req.get("max_completion_tokens", req.get("max_tokens"))
    if asked is not None and (not isinstance(asked, int) or isinstance(asked, bool) or asked < 1):
        raise BadRequest(f"max_tokens={asked!r} must be a positive integer")
    # the costly part last, once every cheap field has passed
    ids = _chat_ids(req, tokenizer, limits) if chat else _prompt_ids(req, tokenizer, limits)
    if not ids:
        raise BadRequest("the prompt is empty: send at least one token of text")
    room = limits.max_context - len(ids)
    if asked is None:
        max_tokens = min(limits.default_max_tokens, max(room, 1))
        if not chat:  # OpenAI's completions default, where the server's is larger
            max_tokens = min(max_tokens, DEFAULT_MAX_TOKENS)
    else:
        max_tokens = asked
    if room < 1 or max_tokens > room:
        raise BadRequest(
            f"the prompt ({len(ids)} tokens) and max_tokens ({max_tokens}) exceed the model's context of "
            f"{limits.max_context} tokens; shorten the prompt or ask for at most {max(room, 0)} tokens"
        )
    return Completion(chat, ids, max_tokens, sampling, stream, stop, ignore_eos, bool(options.get("include_usage")))


def _stop(stop) -> list[str]:
    stop = [] if stop is None else [stop] if isinstance(stop, str) else stop
    if not isinstance(stop, list) or not all(isinstance(s, str) and s for s in stop):
        raise BadRequest("stop must be a string or a list of non-empty strings")
    if len(stop) > MAX_STOPS:
        raise BadRequest(f"stop holds {len(stop)} strings; send at most {MAX_STOPS}")
    long = [s for s in stop if len(s) > MAX_STOP_CHARS]
    if long:
        raise BadRequest(f"a stop string of {len(long[0])} characters; send each at most {MAX_STOP_CHARS}")
    return stop


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
    if seed is not None and not SEED_RANGE[0] <= seed <= SEED_RANGE[1]:
        raise BadRequest(f"seed={seed} is out of range; send an integer from -2**63 to 2**64 - 1")
    if temperature < 0 or not 0 < top_p <= 1:
        raise BadRequest(f"temperature={temperature} must be >= 0 and top_p={top_p} in (0, 1]")
    if temperature < MIN_TEMPERATURE:  # 0: greedy, as OpenAI's API reads it
        return Sampling()
    # an unseeded request draws its own seed, as OpenAI's does: two such requests for one prompt sample apart
    seed = seed if seed is not None else secrets.randbits(63)
    return Sampling(do_sample=True, temperature=temperature, top_p=top_p, seed=seed)


def _fits(text: str, tokenizer, limits: Limits, what: str) -> str:
    """`text`, where it can fit the context: a text longer than the context's tokens times the vocabulary's longest
    token is refused before it is tokenized (tokenizing megabytes costs seconds and gigabytes)."""
    most = max_chars(tokenizer, limits.max_context)
    if len(text) > most:
        raise BadRequest(
            f"the {what} is {len(text)} characters, more than the model's context of {limits.max_context} tokens "
            f"can hold (at most {most}); shorten it"
        )
    return text


def _prompt_ids(req: dict, tokenizer, limits: Limits) -> list[int]:
    prompt = req.get("prompt")
    if isinstance(prompt, list) and len(prompt) == 1 and isinstance(prompt[0], (str, list)):
        prompt = prompt[0]  # a batch of one
    if isinstance(prompt, str):
        return list(tokenizer(_fits(prompt, tokenizer, limits, "prompt")).input_ids)
    if isinstance(prompt, list) and all(isinstance(t, int) and not isinstance(t, bool) for t in prompt):
        vocab = len(tokenizer)
        bad = [t for t in prompt if not 0 <= t < vocab]
        if bad:
            raise BadRequest(f"token id {bad[0]} is outside the vocabulary of {vocab}")
        return list(prompt)
    raise BadRequest("prompt must be a string or a list of token ids (one prompt a request)")


def _content(i: int, m) -> str:
    if not isinstance(m, dict) or not isinstance(m.get("role"), str):
        raise BadRequest(f'messages[{i}] must be {{"role": a string, "content": a string}}')
    content = m.get("content")
    if isinstance(content, list):  # content parts: the text ones, joined
        texts = [p.get("text") for p in content if isinstance(p, dict) and p.get("type") == "text"]
        if not all(isinstance(t, str) for t in texts):
            raise BadRequest(f'messages[{i}]: a text part must be {{"type": "text", "text": a string}}')
        content = "".join(texts)
    if not isinstance(content, str):
        raise BadRequest(f'messages[{i}] must be {{"role": a string, "content": a string}}')
    return content


def _chat_ids(req: dict, tokenizer, limits: Limits) -> list[int]:
    messages = req.get("messages")
    if not isinstance(messages, list) or not messages:
        raise BadRequest('messages must be a non-empty list of {"role": ..., "content": ...}')
    chat = []
    for i, m in enumerate(messages):
        content = _content(i, m)  # checks the message's shape first
        chat.append({"role": m["role"], "content": content})
    _fits("".join(m["role"] + m["content"] for m in chat), tokenizer, limits, "conversation")
    if templated(tokenizer):
        try:
            ids = render_chat(tokenizer, chat, max_chars(tokenizer, limits.max_context))
        except TemplateTooCostly as e:
            raise BadRequest(str(e)) from None
        except Exception as e:  # noqa: BLE001 - a template's own rules (roles that must alternate): its words
            raise BadRequest(f"the model's chat template refuses these messages: {e}") from None
        return list(ids)
    text = "".join(f"{m['role']}: {m['content']}\n" for m in chat) + "assistant:"
    return list(tokenizer(_fits(text, tokenizer, limits, "conversation")).input_ids)


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
    out = {"id": _id(c), "object": kind, "created": c.created, "model": model, "choices": [choice]}
    if c.include_usage:  # OpenAI's: every chunk before the last carries "usage": null
        out["usage"] = None
    return out


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


def error(message: str, status: int, code: str | None = None, param: str | None = None) -> dict:
    """OpenAI's error object: `code` a string or null (the HTTP status is the response's own), `param` the field
    at fault or null."""
    kind = {
        400: "invalid_request_error",
        404: "not_found_error",
        408: "invalid_request_error",
        413: "invalid_request_error",
    }.get(status, "server_error")
    return {"error": {"message": message, "type": kind, "param": param, "code": code}}


def _id(c: Completion) -> str:
    return ("chatcmpl-" if c.chat else "cmpl-") + c.id
