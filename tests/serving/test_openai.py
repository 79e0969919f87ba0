"""The API's requests read and answered (src.serving.openai, src.serving.text): each refusal one line that says
what to send instead; streamed text cut at stop strings and at whole characters."""

import json

import pytest

from src.models.tiny import tiny_model
from src.serving import openai
from src.serving.text import Detokenizer


@pytest.fixture(scope="module")
def tok():
    return tiny_model("gemma3")[1]


def read(tok, body, chat=False, context=64):
    return openai.read(json.dumps(body).encode() if not isinstance(body, bytes) else body, chat, tok, context)


def test_a_completion_reads_its_prompt_length_and_sampling(tok):
    c = read(tok, {"prompt": "hello", "max_tokens": 5, "temperature": 0, "stream": True})
    assert c.prompt_ids == list(tok("hello").input_ids) and c.max_tokens == 5 and c.stream
    assert not c.sampling.do_sample
    c = read(tok, {"prompt": [2, 3, 4], "temperature": 0.7, "top_p": 0.9, "seed": 5, "ignore_eos": True})
    assert c.prompt_ids == [2, 3, 4] and c.max_tokens == openai.DEFAULT_MAX_TOKENS and c.ignore_eos
    assert c.sampling.do_sample and c.sampling.temperature == 0.7 and c.sampling.seed == 5
    chat = read(tok, {"messages": [{"role": "user", "content": "hi"}]}, chat=True)
    assert chat.chat and chat.prompt_ids and chat.max_tokens == 64 - len(chat.prompt_ids)


@pytest.mark.parametrize(
    ("body", "words"),
    [
        (b"{not json", "not JSON"),
        (b"[1, 2]", "JSON object"),
        ({"prompt": []}, "empty"),
        ({"prompt": 5}, "prompt must be"),
        ({"prompt": [2, 99999]}, "outside the vocabulary"),
        ({"prompt": "hi", "max_tokens": 0}, "positive integer"),
        ({"prompt": "hi", "max_tokens": 100}, "exceed the model's context of 64"),
        ({"prompt": [2] * 70}, "exceed the model's context of 64"),
        ({"prompt": "hi", "n": 2}, "one choice"),
        ({"prompt": "hi", "temperature": "hot"}, "must be a number"),
        ({"prompt": "hi", "stop": 3}, "stop must be"),
        ({"prompt": "hi", "logprobs": 2}, "not supported"),
        ({"prompt": "hi", "temperature": 1, "seed": 1 << 64}, "seed=18446744073709551616 is out of range"),
        ({"prompt": "hi", "seed": -(1 << 63) - 1}, "out of range"),
        ({"prompt": "hi", "stop": ["a", "b", "c", "d", "e"]}, "at most 4"),
        ({"prompt": "hi", "stop": "x" * 257}, "each at most 256"),
        ({"prompt": "hi", "ignore_eos": "yes"}, "ignore_eos='yes' must be true or false"),
        ({"prompt": "hi", "stream_options": 3}, "stream_options must be an object"),
        ({"prompt": "x" * 64 * 6}, "more than the model's context of 64 tokens can hold"),
        (b"[" * 100_000, "nests too deeply"),
        # a field it would otherwise ignore: refused, named (OpenAI's own, another server's, a typo)
        ({"prompt": "hi", "top_k": 40}, "top_k=40 is not supported by this server"),
        ({"prompt": "hi", "presence_penalty": 0.5}, "presence_penalty=0.5 is not supported"),
        ({"prompt": "hi", "response_format": {"type": "json_object"}}, "response_format="),
        ({"prompt": "hi", "max_tokns": 4}, "unknown parameter 'max_tokns'"),
    ],
)
def test_a_request_that_cannot_be_served_is_refused_in_one_line(tok, body, words):
    with pytest.raises(openai.BadRequest, match=words) as err:
        read(tok, body)
    assert "\n" not in str(err.value) and err.value.status == 400


@pytest.mark.parametrize(
    "messages",
    [
        [{"role": "user", "content": "a"}, {"content": 3}],
        [{"role": "user", "content": "a"}, "hi"],
        [{"role": "user", "content": "a"}, {"role": "user", "content": [{"type": "text", "text": 5}]}],
        [{"role": "user", "content": "a"}, {"role": 7, "content": "b"}],
    ],
)
def test_chat_messages_must_be_role_and_content(tok, messages):
    with pytest.raises(openai.BadRequest, match=r"messages\[1\]") as err:
        read(tok, {"messages": messages}, chat=True)
    assert err.value.status == 400


def test_a_chat_that_names_no_max_tokens_gets_the_servers_default_not_the_context(tok):
    limits = openai.Limits(max_context=64, default_max_tokens=5)
    chat = read(tok, {"messages": [{"role": "user", "content": "hi"}]}, chat=True, context=limits)
    assert chat.max_tokens == 5
    plain = read(tok, {"prompt": "hi"}, context=limits)
    assert plain.max_tokens == min(openai.DEFAULT_MAX_TOKENS, 5)


def test_a_field_of_an_unforeseen_shape_is_a_400_with_its_line_not_a_dropped_connection(tok):
    class Broken:  # a tokenizer that fails as no check foresaw: still a BadRequest, one line
        def __call__(self, text):
            raise RuntimeError("the tokenizer broke\nsecond line")

        def get_vocab(self):
            return {"a": 0}

    with pytest.raises(openai.BadRequest, match=r"RuntimeError: the tokenizer broke\)") as err:
        read(Broken(), {"prompt": "hi"})
    assert "\n" not in str(err.value)


def test_streamed_text_stops_before_a_stop_string_and_holds_back_its_start(tok):
    ids = list(tok("abc STOP def", add_special_tokens=False).input_ids)
    text = Detokenizer(tok, ["STOP"])
    pieces = []
    for t in ids:
        pieces.append(text.add(t))
        if text.stopped:
            break
    assert "".join(pieces) == "abc " and text.stopped
    plain = Detokenizer(tok, [])
    assert "".join(plain.add(t) for t in ids) + plain.add(None) == "abc STOP def"


def test_streamed_text_equals_the_whole_decode_and_each_token_decodes_a_window_of_few_tokens(tok):
    """Incremental detokenizing: the pieces join to what decoding the whole gives, stop strings cut where a whole
    search would, and no decode call reads more than a few tokens however long the text (time per token does
    not grow with the text)."""
    import random

    rng = random.Random(0)
    widths = []

    class Counting:
        def decode(self, ids, skip_special_tokens=True):
            widths.append(len(ids))
            return tok.decode(ids, skip_special_tokens=skip_special_tokens)

    for trial in range(60):
        words = rng.choices(["def", " x", "=", " 1", "\n", " é", "日本", " 🙂", "STOP", " ."], k=rng.randrange(1, 200))
        ids = list(tok("".join(words), add_special_tokens=False).input_ids)
        whole = tok.decode(ids, skip_special_tokens=True)
        k = rng.randrange(len(whole) - 3) if len(whole) > 10 else 0
        stop = [whole[k : k + 3]] if trial % 2 and len(whole) > 10 and whole[k : k + 3].strip() else []
        text = Detokenizer(Counting(), stop)
        pieces = []
        for t in ids:
            pieces.append(text.add(t))
            if text.stopped:
                break
        pieces.append(text.add(None))
        expected = whole[: whole.find(stop[0])] if stop else whole
        assert "".join(pieces) == expected
    assert max(widths) <= 8  # a character is at most 4 tokens here (bytes), plus the window's before it


def test_answers_have_openais_shapes(tok):
    c = read(tok, {"prompt": "hi"})
    whole = openai.whole(c, "m", "text", "length", 3)
    assert whole["object"] == "text_completion" and whole["choices"][0]["text"] == "text"
    assert whole["usage"] == {
        "prompt_tokens": len(c.prompt_ids),
        "completion_tokens": 3,
        "total_tokens": len(c.prompt_ids) + 3,
    }
    chat = read(tok, {"messages": [{"role": "user", "content": "hi"}]}, chat=True)
    first = openai.chunk(chat, "m", "a", None, first=True)
    assert first["object"] == "chat.completion.chunk" and first["choices"][0]["delta"] == {
        "role": "assistant",
        "content": "a",
    }
    assert openai.error("x", 503)["error"]["type"] == "server_error"


def test_the_answers_carry_what_openais_client_reads(tok):
    """OpenAI's shapes: an error's code is a string or null (the HTTP status is the response's own) beside its param;
    with include_usage every chunk before the usage chunk says "usage": null; without it, none does."""
    assert openai.error("x", 400) == {
        "error": {"message": "x", "type": "invalid_request_error", "param": None, "code": None}
    }
    assert openai.error("y", 404, "model_not_found", "model")["error"]["code"] == "model_not_found"
    c = read(tok, {"prompt": "hi", "stream": True, "stream_options": {"include_usage": True}})
    assert "usage" in openai.chunk(c, "m", "a", None, first=True) and openai.chunk(c, "m", "a", None)["usage"] is None
    assert openai.usage_chunk(c, "m", 2)["usage"]["completion_tokens"] == 2
    plain = read(tok, {"prompt": "hi", "stream": True})
    assert "usage" not in openai.chunk(plain, "m", "a", None)


def test_an_unseeded_sampled_request_draws_its_own_seed_and_a_seeded_one_keeps_it(tok):
    """Two unseeded sampled requests for one prompt sample apart (OpenAI's behaviour; a fixed seed 0 had made them
    identical); a seed sent is kept; greedy has none."""
    seeds = {read(tok, {"prompt": "hi", "temperature": 0.8}).sampling.seed for _ in range(4)}
    assert len(seeds) == 4
    assert read(tok, {"prompt": "hi", "temperature": 0.8, "seed": 7}).sampling.seed == 7
    assert not read(tok, {"prompt": "hi", "temperature": 0}).sampling.do_sample


def test_a_field_at_the_value_that_leaves_the_answer_as_served_is_read(tok):
    """presence_penalty 0, top_k -1, response_format text, a user id: what clients send by default is served."""
    body = {"prompt": "hi", "presence_penalty": 0, "frequency_penalty": 0.0, "top_k": -1, "user": "u1"}
    body["response_format"] = {"type": "text"}
    assert read(tok, body).prompt_ids == list(tok("hi").input_ids)
