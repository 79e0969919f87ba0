"""Models as a user brings them: a tiny model published into a Hugging Face cache, a tiny GGUF file."""

from __future__ import annotations

import os
import shutil
from pathlib import Path

from src.assembly import schema  # noqa: F401 - the groups' schemas, which every composition is typed by
from src.models.gguf_names import gguf_name


def publish_to_hub_cache(cache: Path, repo_id: str, model, tokenizer) -> Path:
    """`model` and `tokenizer` laid out in the Hugging Face cache at `cache` as the hub's download lays them
    (models--org--name/: blobs/<sha256>, snapshots/<commit>/<file> linked to its blob, refs/main naming the
    commit): what `hf download repo_id` leaves, made offline. Returns the snapshot folder."""
    import hashlib
    import tempfile

    repo = cache / f"models--{repo_id.replace('/', '--')}"
    commit = hashlib.sha1(repo_id.encode()).hexdigest()
    snapshot = repo / "snapshots" / commit
    (repo / "blobs").mkdir(parents=True)
    snapshot.mkdir(parents=True)
    with tempfile.TemporaryDirectory() as saved:
        model.save_pretrained(saved)
        tokenizer.save_pretrained(saved)
        for file in Path(saved).iterdir():
            blob = repo / "blobs" / hashlib.sha256(file.read_bytes()).hexdigest()
            shutil.copyfile(file, blob)
            (snapshot / file.name).symlink_to(os.path.relpath(blob, snapshot))
    (repo / "refs").mkdir()
    (repo / "refs" / "main").write_text(commit)
    return snapshot


def write_tiny_gguf(path: Path):
    """src.models.tiny's qwen2 written as a GGUF file at `path` (float32 tensors under llama.cpp's names, its byte
    vocabulary as a gpt2-type tokenizer): a local GGUF of a served family, made in a second. Returns the model and
    tokenizer it was written from."""
    import gguf

    from src.models.tiny import tiny_model

    model, tokenizer = tiny_model("qwen2")
    c = model.config
    writer = gguf.GGUFWriter(str(path), "qwen2")
    writer.add_context_length(c.max_position_embeddings)
    writer.add_embedding_length(c.hidden_size)
    writer.add_block_count(c.num_hidden_layers)
    writer.add_feed_forward_length(c.intermediate_size)
    writer.add_head_count(c.num_attention_heads)
    writer.add_head_count_kv(c.num_key_value_heads)
    writer.add_rope_freq_base(float(c.rope_parameters["rope_theta"]))
    writer.add_layer_norm_rms_eps(c.rms_norm_eps)
    tokens = [t for t, _ in sorted(tokenizer.get_vocab().items(), key=lambda item: item[1])]
    writer.add_tokenizer_model("gpt2")
    writer.add_token_list(tokens)
    writer.add_token_types([3 if t in tokenizer.all_special_tokens else 1 for t in tokens])  # 3: control
    writer.add_token_scores([0.0] * len(tokens))  # no merges: transformers derives none from single bytes
    writer.add_bos_token_id(tokenizer.bos_token_id)
    writer.add_eos_token_id(tokenizer.eos_token_id)
    writer.add_pad_token_id(tokenizer.pad_token_id)
    writer.add_add_bos_token(True)
    for key, value in model.state_dict().items():
        writer.add_tensor(gguf_name(key), value.float().numpy())
    writer.write_header_to_file()
    writer.write_kv_data_to_file()
    writer.write_tensors_to_file()
    writer.close()
    return model, tokenizer
