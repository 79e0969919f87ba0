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


def encode(tokenizer, prompt: Prompt) -> list[int]:
    """The prompt's token ids: a chat through the chat template where there is one, else its text as a prompt."""
    if prompt.messages and templated(tokenizer):
        chat = [{"role": role, "content": content} for role, content in prompt.messages]
        ids = tokenizer.apply_chat_template(chat, add_generation_prompt=True, tokenize=True)
        return list(ids["input_ids"] if isinstance(ids, dict) or hasattr(ids, "keys") else ids)
    return list(tokenizer(prompt.flat()).input_ids)
