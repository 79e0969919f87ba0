"""Prompts of the user's own (src.data.prompts): plain, OpenAI-style chats and ShareGPT conversations read from a
JSONL file, every bad line named by its number, a chat through the tokenizer's chat template."""

import json

import pytest

from src.data import prompts
from src.models.tiny import byte_tokenizer

FIVE = [
    {"prompt": "What is recursion?"},
    {"messages": [{"role": "system", "content": "Be terse."}, {"role": "user", "content": "Name a prime."}]},
    {
        "conversations": [
            {"from": "human", "value": "Hi"},
            {"from": "gpt", "value": "Hello"},
            {"from": "human", "value": "2+2?"},
            {"from": "gpt", "value": "4"},
        ]
    },
    {"messages": [{"role": "user", "content": "Tell me a one line joke."}]},
    {"prompt": "How did it all begin?"},
]


def write(path, items) -> str:
    path.write_text("".join((json.dumps(i) if not isinstance(i, str) else i) + "\n" for i in items))
    return str(path)


def test_each_form_becomes_a_prompt_and_a_sharegpt_conversation_ends_at_its_last_human_turn(tmp_path):
    found = prompts.read(write(tmp_path / "p.jsonl", [FIVE[0], "", *FIVE[1:]]), 64)  # a blank line is skipped
    assert [p.line for p in found] == [1, 3, 4, 5, 6]
    assert found[0].text == "What is recursion?" and found[0].messages == ()
    assert found[1].messages == (("system", "Be terse."), ("user", "Name a prime."))
    assert found[2].messages == (("user", "Hi"), ("assistant", "Hello"), ("user", "2+2?"))  # its answer cut
    assert [p.label for p in found] == [
        "What is recursion?",
        "Name a prime.",
        "2+2?",
        "Tell me a one line joke.",
        "How did it all begin?",
    ]


@pytest.mark.parametrize(
    "line, words",
    [
        ("{not json", "line 2 is not JSON (Expecting property name enclosed in double quotes"),
        ("[1, 2]", 'line 2 is list, not an object with "prompt" or "messages"'),
        ('{"text": "x"}', 'line 2 has none of "prompt", "messages" or "conversations" (keys: text)'),
        ('{"prompt": ""}', 'line 2: "prompt" must be a non-empty string'),
        ('{"messages": []}', "line 2: a chat must be a non-empty list of turns"),
        ('{"messages": [{"role": "bot", "content": "x"}]}', 'line 2: turn 1 must be {"role": one of system, user'),
        ('{"conversations": [{"from": "gpt", "value": "x"}]}', "line 2: the conversation has no human turn to answer"),
    ],
)
def test_a_bad_line_is_named_by_its_number(tmp_path, line, words):
    path = write(tmp_path / "p.jsonl", [FIVE[0], line])
    with pytest.raises(prompts.PromptsError) as err:
        prompts.read(path, 64)
    assert str(err.value).startswith(f"dataset.path={path} {words}"), err.value


def test_a_file_that_is_not_one_or_holds_none_is_one_line(tmp_path):
    with pytest.raises(prompts.PromptsError, match="is not a file"):
        prompts.read(str(tmp_path / "none.jsonl"), 64)
    with pytest.raises(prompts.PromptsError, match="holds no prompt"):
        prompts.read(write(tmp_path / "empty.jsonl", ["", "  "]), 64)


def test_a_chat_goes_through_the_chat_template_where_the_tokenizer_has_one():
    tok = byte_tokenizer()
    chat = prompts.Prompt(1, messages=(("user", "Name a prime."),))
    plain = prompts.encode(tok, chat)  # no template: the turns' text, as a prompt is encoded
    assert plain == tok("Name a prime.").input_ids and not prompts.templated(tok)
    tok.chat_template = "{% for m in messages %}<{{ m.role }}>{{ m.content }}{% endfor %}{% if add_generation_prompt %}<assistant>{% endif %}"
    assert tok.decode(prompts.encode(tok, chat)).endswith("<user>Name a prime.<assistant>")
    assert prompts.encode(tok, prompts.Prompt(1, text="x")) == tok("x").input_ids  # a plain prompt stays plain


GEMMA_LIKE = (
    "{{ bos_token }}{% for m in messages %}{% if m['role'] == 'assistant' %}{% set role = 'model' %}"
    "{% else %}{% set role = m['role'] %}{% endif %}<start_of_turn>{{ role }}\n{{ m['content'] | trim }}"
    "<end_of_turn>\n{% endfor %}{% if add_generation_prompt %}<start_of_turn>model\n{% endif %}"
)


def test_a_chat_renders_as_transformers_renders_it():
    tok = byte_tokenizer()
    tok.chat_template = GEMMA_LIKE
    chat = [
        {"role": "system", "content": "Be terse."},
        {"role": "user", "content": " Name a prime. "},
        {"role": "assistant", "content": "7"},
        {"role": "user", "content": "é 日本"},
    ]
    theirs = tok.apply_chat_template(chat, add_generation_prompt=True, tokenize=True)
    theirs = list(theirs["input_ids"] if hasattr(theirs, "keys") else theirs)
    assert prompts.render_chat(tok, chat, 10_000) == theirs


@pytest.mark.parametrize(
    ("template", "words"),
    [
        # loops that write: the output passes the size bound
        (
            "{% for i in range(100000) %}{% for j in range(100000) %}{{ messages[0].content }}{% endfor %}{% endfor %}",
            "over 5000 characters",
        ),
        # loops that write nothing: the time bound, checked where the template counts
        ("{% for i in range(100000) %}{% for j in range(100000) %}{% endfor %}{% endfor %}", "ran past 1 s"),
    ],
    ids=["writes", "silent"],
)
def test_a_template_that_grows_without_bound_is_stopped_in_one_line(template, words):
    tok = byte_tokenizer()
    tok.chat_template = template
    with pytest.raises(prompts.TemplateTooCostly, match=words) as err:
        prompts.render_chat(tok, [{"role": "user", "content": "hi"}], 5000, within_s=1.0)
    assert "\n" not in str(err.value)


def test_a_prompt_longer_than_the_context_can_hold_is_refused_before_it_is_tokenized():
    tok = byte_tokenizer()
    calls = []
    original = type(tok).__call__

    class Watching(type(tok)):
        def __call__(self, *args, **kwargs):
            calls.append(args)
            return original(self, *args, **kwargs)

    tok.__class__ = Watching
    longest = prompts.longest_token(tok)
    fits = prompts.Prompt(3, text="x" * 64 * longest)
    assert len(prompts.encode(tok, fits, 64)) > 64  # it may still not fit: the context check says so after
    calls.clear()
    with pytest.raises(prompts.PromptsError, match=r"the prompt on line 7 is \d+ characters, more than") as err:
        prompts.encode(tok, prompts.Prompt(7, text="x" * (64 * longest + 1)), 64)
    assert calls == [] and "\n" not in str(err.value)
