"""quantspec's OpenAI-compatible server over continuous batching (src.engine.batching): the HTTP side (http), the API's requests and answers (openai), tokens to text (text)."""
