"""Prompts of the user's own (`dataset=jsonl dataset.path=<file>`): one JSON object a line, each one of

    {"prompt": "What is recursion?"}                                   a plain prompt, as the seed prompts are
    {"messages": [{"role": "user", "content": "What is recursion?"}]}   a chat, OpenAI's form
    {"conversations": [{"from": "human", "value": "What is ..."}]}      a chat, ShareGPT's form

A chat is put through the tokenizer's chat template (with the generation prompt after it, so the model answers
the last user turn) where the tokenizer has one; where it has none, its turns' contents are joined by blank lines
and the job says so. A ShareGPT conversation is cut after its last human turn (what follows is the answer the
model is to write). The file is read and checked when the job's config is converted, before anything loads: a
line that is not one of these is refused in one line naming its number.
"""

from __future__ import annotations

import json
import time
from dataclasses import dataclass
from pathlib import Path

ROLES = ("system", "user", "assistant")
SHAREGPT_ROLES = {"system": "system", "human": "user", "user": "user", "gpt": "assistant", "assistant": "assistant"}


class PromptsError(ValueError):
    """A prompts file that cannot be read as prompts; the message is the one line the user sees."""


@dataclass(frozen=True)
class Prompt:
    line: int  # its line in the file (1-based)
    text: str | None = None  # a plain prompt
    messages: tuple[tuple[str, str], ...] = ()  # a chat: (role, content) turns

    @property
    def label(self) -> str:
        """What the responses artifact shows as the prompt."""
        return self.text if self.text is not None else self.messages[-1][1]

    def flat(self) -> str:
        """The prompt as plain text (a chat's turns joined): a corpus's text, and a chat without a template."""
        return self.text if self.text is not None else "\n\n".join(content for _, content in self.messages)


def read(path: str, max_mb: int) -> list[Prompt]:
    """Every prompt of the file, checked; PromptsError for the first line that is not one."""
    file = Path(path).expanduser()
    if not file.is_file():
        raise PromptsError(f"dataset.path={path} is not a file")
    if file.stat().st_size > max_mb << 20:
        raise PromptsError(f"dataset.path={path} is over dataset.max_mb={max_mb}; cut it or raise dataset.max_mb")
    try:
        lines = file.read_text(encoding="utf-8").splitlines()
    except UnicodeDecodeError as err:
        raise PromptsError(f"dataset.path={path} is not UTF-8 text (offset {err.start}); convert it") from None
    found = [_prompt(path, n, line) for n, line in enumerate(lines, start=1) if line.strip()]
    if not found:
        raise PromptsError(f'dataset.path={path} holds no prompt: one JSON object a line, e.g. {{"prompt": "..."}}')
    return found


def _prompt(path: str, n: int, line: str) -> Prompt:
    where = f"dataset.path={path} line {n}"
    try:
        item = json.loads(line)
    except ValueError as err:
        raise PromptsError(f"{where} is not JSON ({str(err).split(':')[0]})") from None
    if not isinstance(item, dict):
        raise PromptsError(f'{where} is {type(item).__name__}, not an object with "prompt" or "messages"')
    if "prompt" in item:
        if not isinstance(item["prompt"], str) or not item["prompt"].strip():
            raise PromptsError(f'{where}: "prompt" must be a non-empty string')
        return Prompt(n, text=item["prompt"])
    if "messages" in item:
        return Prompt(n, messages=_turns(where, item["messages"], "role", "content", {r: r for r in ROLES}))
    if "conversations" in item:
        turns = _turns(where, item["conversations"], "from", "value", SHAREGPT_ROLES)
        last = max((i for i, (role, _) in enumerate(turns) if role == "user"), default=None)
        if last is None:
            raise PromptsError(f"{where}: the conversation has no human turn to answer")
        return Prompt(n, messages=turns[: last + 1])
    raise PromptsError(f'{where} has none of "prompt", "messages" or "conversations" (keys: {", ".join(item)})')


def _turns(where: str, turns, role_key: str, content_key: str, roles: dict[str, str]) -> tuple[tuple[str, str], ...]:
    if not isinstance(turns, list) or not turns:
        raise PromptsError(f"{where}: a chat must be a non-empty list of turns")
    out = []
    for i, turn in enumerate(turns, start=1):
        ok = isinstance(turn, dict) and turn.get(role_key) in roles and isinstance(turn.get(content_key), str)
        if not ok:
            raise PromptsError(
                f'{where}: turn {i} must be {{"{role_key}": one of {", ".join(roles)}, "{content_key}": a string}}'
            )
        out.append((roles[turn[role_key]], turn[content_key]))
    return tuple(out)


def templated(tokenizer) -> bool:
    return bool(getattr(tokenizer, "chat_template", None))


TEMPLATE_S = 2.0  # seconds a chat template may take to render one conversation


class TemplateTooCostly(ValueError):
    """A chat template that ran past its time or size bound (a model folder's template with loops that grow)."""


def render_chat(tokenizer, chat: list[dict], max_chars: int, within_s: float = TEMPLATE_S) -> list[int]:
    """The conversation's token ids through the tokenizer's chat template (the generation prompt after it), as
    transformers' apply_chat_template makes them, rendered piece by piece: past `max_chars` characters or
    `within_s` seconds it stops with TemplateTooCostly (a template is a model folder's code, run in Jinja's
    sandbox, which bounds what it may touch but not how long it runs). The deadline is checked at every piece of
    output and every `range` the template calls, so a loop that writes nothing is bounded too where it counts
    with `range`."""
    from transformers.utils.chat_template_utils import _compile_jinja_template  # noqa: PLC0415 - transformers' own

    template = _compile_jinja_template(tokenizer.chat_template)
    deadline = time.monotonic() + within_s
    late = TemplateTooCostly(
        f"the model's chat template ran past {within_s:.0f} s on this conversation; shorten it or fix the template"
    )

    def bounded_range(*args):
        if time.monotonic() > deadline:
            raise late
        return template.environment.globals.get("range", range)(*args)

    values = {**tokenizer.special_tokens_map, "range": bounded_range}
    pieces, size = [], 0
    for piece in template.generate(messages=chat, tools=None, documents=None, add_generation_prompt=True, **values):
        size += len(piece)
        if size > max_chars:
            raise TemplateTooCostly(
                f"the model's chat template made over {max_chars} characters of this conversation, more than the "
                "context holds; shorten it"
            )
        if time.monotonic() > deadline:
            raise late
        pieces.append(piece)
    return list(tokenizer("".join(pieces), add_special_tokens=False).input_ids)


def longest_token(tokenizer) -> int:
    """Characters in the vocabulary's longest token (at least 1), computed once per tokenizer: a text of more
    characters than a context's tokens times this cannot fit that context, which is known before tokenizing it."""
    found = getattr(tokenizer, "_quantspec_longest", None)
    if found is None:
        found = max((len(t) for t in tokenizer.get_vocab()), default=1)
        try:
            tokenizer._quantspec_longest = found
        except AttributeError:  # a tokenizer that takes no attributes: computed again next time
            pass
    return max(1, found)


def max_chars(tokenizer, max_context: int) -> int:
    """The most characters a text that fits `max_context` tokens can have: its tokens times the longest one's."""
    return max_context * longest_token(tokenizer)


def encode(tokenizer, prompt: Prompt, max_context: int | None = None) -> list[int]:
    """The prompt's token ids: a chat through the chat template where there is one, else its text as a prompt.
    With `max_context`, a prompt that cannot fit it (more characters than its tokens times the vocabulary's
    longest token) is refused before it is tokenized (PromptsError naming its line): a 60 MB line had been
    tokenized whole, past 12 GB, after the model loaded."""
    most = max_chars(tokenizer, max_context) if max_context else 1 << 30
    text = prompt.flat()
    if len(text) > most:
        raise PromptsError(
            f"the prompt on line {prompt.line} is {len(text)} characters, more than the model's context of "
            f"{max_context} tokens can hold (at most {most}); shorten it"
        )
    if prompt.messages and templated(tokenizer):
        chat = [{"role": role, "content": content} for role, content in prompt.messages]
        return render_chat(tokenizer, chat, most)
    return list(tokenizer(text).input_ids)
