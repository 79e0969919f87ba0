"""The server as OpenAI's own Python client reads it (the `openai` package): completions and chats, streamed and
whole, the usage it counts, the model it lists, and each refusal raised as the client's own error class. A tiny
model on quantspec's batched step, served in this process on a loopback port."""

import openai
import pytest

from src.serving import http
from tests.engine.tiny import model_at

NAME = "tiny-gemma3"


@pytest.fixture(scope="module")
def client():
    model, tok = model_at("gemma3", "fp32")
    app = http.App(model, tok, NAME, 128, http.Settings(max_sequences=4, max_batch_tokens=8))
    server = http.start(app)
    # one retry-free client: a refusal must come back as the server sent it, not retried into another status
    yield openai.OpenAI(base_url=f"{server.url()}/v1", api_key="none", max_retries=0, timeout=120)
    server.close()


def test_a_completion_whole_and_streamed_say_the_same_text(client):
    whole = client.completions.create(model=NAME, prompt="hello", max_tokens=6, temperature=0)
    assert whole.object == "text_completion" and whole.model == NAME
    assert whole.usage.completion_tokens == 6 and whole.choices[0].finish_reason == "length"
    pieces = client.completions.create(model=NAME, prompt="hello", max_tokens=6, temperature=0, stream=True)
    assert "".join(c.choices[0].text for c in pieces if c.choices) == whole.choices[0].text


def test_a_chat_streamed_with_usage_ends_with_its_count(client):
    messages = [{"role": "user", "content": "hi"}]
    whole = client.chat.completions.create(model=NAME, messages=messages, max_tokens=5, temperature=0)
    assert whole.choices[0].message.role == "assistant" and whole.usage.completion_tokens == 5
    chunks = list(
        client.chat.completions.create(
            model=NAME, messages=messages, max_tokens=5, temperature=0, stream=True,
            stream_options={"include_usage": True},
        )
    )  # fmt: skip
    assert all(c.usage is None for c in chunks[:-1]) and chunks[-1].usage.completion_tokens == 5
    text = "".join(c.choices[0].delta.content or "" for c in chunks if c.choices)
    assert text == whole.choices[0].message.content


def test_the_model_is_listed_and_another_name_is_not_found(client):
    listed = client.models.list().data
    assert [m.id for m in listed] == [NAME] and listed[0].created > 0
    with pytest.raises(openai.NotFoundError) as err:
        client.completions.create(model="gpt-4o", prompt="hi", max_tokens=2)
    assert err.value.code == "model_not_found" and "gpt-4o" in err.value.message


def test_a_refused_field_is_the_clients_bad_request_naming_it(client):
    with pytest.raises(openai.BadRequestError) as err:
        client.completions.create(model=NAME, prompt="hi", max_tokens=2, presence_penalty=0.5)
    assert "presence_penalty=0.5 is not supported" in err.value.message
    with pytest.raises(openai.BadRequestError, match="unknown parameter 'max_tokns'"):
        client.completions.create(model=NAME, prompt="hi", extra_body={"max_tokns": 4})


def test_streams_share_one_connection(client):
    """A stream's end is a chunk of its own, not the connection's close: the client's pool reuses it."""
    seen = []
    for _ in range(3):
        with client.completions.with_streaming_response.create(
            model=NAME, prompt="hi", max_tokens=3, temperature=0, stream=True
        ) as response:
            assert response.headers.get("transfer-encoding") == "chunked"
            seen.append(response.http_response.extensions["network_stream"])
            list(response.iter_lines())
    assert len({id(s) for s in seen}) == 1
