"""Long prompts at Llama-2-7B's shape: quantspec's benchmark_long beside llama.cpp on the same shape.

    .venv/bin/python -m scripts.bench_long_llamacpp                          # w8a8 vs Q8_0, w4a16 vs Q4_K_M
    .venv/bin/python -m scripts.bench_long_llamacpp pairs=w8a8:Q8_0 lengths=512,2048

No 7B weights can be fetched here, and prefill and decode time depend on the shapes, not the values: so
both sides run random weights. quantspec runs `python -m src.run model=llama-2-7b model.weights=random
precision=<p> task=benchmark_long` (a whole job, its prefill and time/token per prompt length read back
from MLflow); llama.cpp (llama-cpp-python, a reference, not a dependency) runs a GGUF this script writes
with Llama-2-7B's published shape (src/shapes/llama-2-7b.json) and random blocks of the GGUF's own
quantized types, each built once into the cache: Q8_0 throughout, or llama.cpp's Q4_K_M mix (Q4_K, with
Q6_K for the output head and for attn_v / ffn_down in the layers its `use_more_bits` picks). The same
prompt lengths, prefilled in one call each, then the same number of single-token steps; the jobs and
llama.cpp take turns per precision, so both see the same machine load. Writes reports/bench-long-*.md.
"""

from __future__ import annotations

import json
import math
import sys
import tempfile
from pathlib import Path

import numpy as np

from scripts import bench
from scripts.peer import cache_dir, import_llama_cpp, llama_cpp_long, long_job
from src.common.environment import PROJECT_ROOT as ROOT
from src.common.metrics import markdown_table
from src.common.settings import Setting

MODEL = "llama-2-7b"
TOKENS = 16  # single-token steps after each prefill

# GGUF block layouts (ggml-common.h): bytes per block of values, and where each block's fp16 scales sit.
BLOCKS = {"Q8_0": (32, 34, [0]), "Q4_K": (256, 144, [0, 2]), "Q6_K": (256, 210, [208])}
FP16_SCALE = np.array([0.002], dtype=np.float16).view(np.uint8)  # small, finite: no inf/NaN in the sums


def _blocks(kind: str, rows: int, cols: int, rng: np.random.Generator) -> np.ndarray:
    """[rows, bytes per row] of random blocks of `kind`, scales set finite. One random row is shifted
    along for the others: values do not matter to the timing, building them must be quick."""
    per, size, scales = BLOCKS[kind]
    row_bytes = cols // per * size
    row = rng.integers(0, 256, size=(cols // per, size), dtype=np.uint8)
    for at in scales:
        row[:, at : at + 2] = FP16_SCALE
    row = row.reshape(-1)
    out = np.empty((rows, row_bytes), dtype=np.uint8)
    for r in range(rows):
        out[r] = np.roll(row, (r * 7919) % (cols // per) * size)
    return out


def _more_bits(layer: int, layers: int) -> bool:
    """llama.cpp's use_more_bits (llama-quant.cpp): the layers Q4_K_M gives Q6_K for attn_v, ffn_down."""
    return layer < layers // 8 or layer >= 7 * layers // 8 or (layer - layers // 8) % 3 == 2


def write_gguf(path: Path, mix: str) -> Path:
    import gguf

    shape = json.loads((ROOT / "src" / "shapes" / f"{MODEL}.json").read_text())
    hidden, ffn, layers = shape["hidden_size"], shape["intermediate_size"], shape["num_hidden_layers"]
    heads, vocab = shape["num_attention_heads"], shape["vocab_size"]
    rng = np.random.default_rng(0)

    def kind(name: str, layer: int | None) -> str:
        if mix == "Q8_0":
            return "Q8_0"
        if name == "output" or (name in ("attn_v", "ffn_down") and _more_bits(layer, layers)):
            return "Q6_K"
        return "Q4_K"

    tensors: list[tuple[str, str | None, int, int]] = [("token_embd.weight", kind("token_embd", None), vocab, hidden)]
    for i in range(layers):
        tensors += [(f"blk.{i}.attn_norm.weight", None, 1, hidden), (f"blk.{i}.ffn_norm.weight", None, 1, hidden)]
        for name, rows, cols in [
            ("attn_q", hidden, hidden),
            ("attn_k", hidden, hidden),
            ("attn_v", hidden, hidden),
            ("attn_output", hidden, hidden),
            ("ffn_gate", ffn, hidden),
            ("ffn_up", ffn, hidden),
            ("ffn_down", hidden, ffn),
        ]:
            tensors.append((f"blk.{i}.{name}.weight", kind(name, i), rows, cols))
    tensors += [("output_norm.weight", None, 1, hidden), ("output.weight", kind("output", None), vocab, hidden)]

    tmp = path.with_suffix(".partial")
    writer = gguf.GGUFWriter(str(tmp), arch="llama")
    writer.add_name(f"{MODEL} (random weights, {mix})")
    writer.add_context_length(shape["max_position_embeddings"])
    writer.add_embedding_length(hidden)
    writer.add_block_count(layers)
    writer.add_feed_forward_length(ffn)
    writer.add_head_count(heads)
    writer.add_head_count_kv(shape["num_key_value_heads"])
    writer.add_rope_dimension_count(hidden // heads)
    writer.add_rope_freq_base(shape["rope_theta"])
    writer.add_layer_norm_rms_eps(shape["rms_norm_eps"])
    # a vocabulary of the right size (prompts are token ids here: its strings are never used)
    tokens = ["<unk>", "<s>", "</s>"] + [f"<0x{b:02X}>" for b in range(256)]
    tokens += [f"\u2581t{i}" for i in range(vocab - len(tokens))]
    types = [2, 3, 3] + [6] * 256 + [1] * (vocab - 259)
    writer.add_tokenizer_model("llama")
    writer.add_token_list(tokens)
    writer.add_token_scores([0.0] * vocab)
    writer.add_token_types(types)
    writer.add_bos_token_id(1)
    writer.add_eos_token_id(2)
    writer.add_unk_token_id(0)
    for tensor, k, rows, cols in tensors:
        if k is None:
            writer.add_tensor_info(tensor, [cols], np.dtype(np.float32), cols * 4)
        else:
            per, size, _ = BLOCKS[k]
            writer.add_tensor_info(
                tensor,
                [rows, cols // per * size],
                np.dtype(np.uint8),
                rows * cols // per * size,
                raw_dtype=getattr(gguf.GGMLQuantizationType, k),
            )
    writer.write_header_to_file()
    writer.write_kv_data_to_file()
    writer.write_ti_data_to_file()
    for _name, k, rows, cols in tensors:
        writer.write_tensor_data(np.ones(cols, dtype=np.float32) if k is None else _blocks(k, rows, cols, rng))
    writer.close()
    tmp.rename(path)
    return path


COMMAND = bench.command(
    "bench_long_llamacpp",
    __doc__,
    [
        Setting("pairs", ("w8a8:Q8_0", "w4a16:Q4_K_M"), "quantspec precision : llama.cpp GGUF mix (Q8_0 or Q4_K_M)"),
        Setting("lengths", ("512", "1024", "2048", "4000"), "the prompt lengths"),
    ],
)


def main(argv: list[str]) -> int:
    args, extra = bench.parse(COMMAND, argv)
    lengths = bench.whole_numbers("lengths", args.lengths)
    llama_cpp = import_llama_cpp()
    if llama_cpp is None:
        return 2
    import torch

    cache = cache_dir() / "gguf-random"
    cache.mkdir(parents=True, exist_ok=True)
    store = f"sqlite:///{tempfile.mkdtemp(prefix='bench-long-store-')}/mlflow.db"
    threads = torch.get_num_threads()
    rows = []
    for pair in args.pairs:
        precision, mix = pair.split(":")
        path = cache / f"{MODEL}-{mix}.gguf"
        if not path.is_file():
            print(f"writing {path} (random {mix} blocks at {MODEL}'s shape)", flush=True)
            write_gguf(path, mix)
        q = long_job(
            store, [f"model={MODEL}", "model.weights=random", f"precision={precision}", *extra], lengths, TOKENS
        )
        ref = llama_cpp_long(path, lengths, threads, TOKENS, first=1, vocab=(259, 32000))
        for n in lengths:
            (qp, qt), (rp, rt) = q.get(n, (math.nan, math.nan)), ref[n]
            rows.append([n, f"quantspec {precision}", qp, qt, f"llama.cpp {mix}", rp, rt, qp / rp, qt / rt])
            print(
                f"{n} tokens: quantspec {precision} prefill {qp:.0f} ms, {qt:.1f} ms/token; "
                f"llama.cpp {mix} prefill {rp:.0f} ms, {rt:.1f} ms/token",
                flush=True,
            )
    table = markdown_table(
        [
            "prompt tokens",
            "quantspec",
            "prefill ms",
            "ms/token",
            "llama.cpp",
            "prefill ms",
            "ms/token",
            "prefill ratio",
            "time/token ratio",
        ],
        rows,
    )
    bench.publish(
        args.doc,
        "seven-b",
        f"Long prompts at {MODEL}'s shape against llama.cpp",
        table,
        f"llama.cpp {llama_cpp.__version__}, {threads} threads, random blocks of llama.cpp's own types; each prompt "
        f"prefilled in one call, then {TOKENS} single-token steps, each side in turns.",
        bench.stamp("long"),
    )
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
