"""Quantizing the seeds' 7B, beside llama.cpp's llama-quantize on the same weights, timed in turns.

    .venv/bin/python -m scripts.bench_seven_b                              # rtn and the default w4a16, 1 round
    .venv/bin/python -m scripts.bench_seven_b methods=rtn rounds=3
    .venv/bin/python -m scripts.bench_seven_b model=llama-160m rounds=2    # the same at a small shape, in minutes

Writes, once, under the cache (QUANTSPEC_CACHE, else ~/.cache/quantspec): a local checkpoint of random bf16 weights
at the model's published shape (one safetensors file a layer, with its index, config.json and a byte-level
tokenizer), and an F16 GGUF of the same weights under llama.cpp's names with the Llama SPM vocabulary llama.cpp's
sources ship (models/ggml-vocab-llama-spm.gguf, which scripts/build_llama_server copies beside its tools). Then each
round, in turns: llama-quantize F16 -> Q4_K_M (wall time and peak memory, by /usr/bin/time), each quantspec method
as a user runs it (`python -m src.run model=hub model.local_path=<checkpoint> precision=w4a16 task=quantize`, its
cache entry removed first; `quantize_s` and `peak_rss_gb` read back from its run), and a job whose quantized weights
are cached (`task=decode`: `quant_load_s`, `peak_rss_gb`, against 1.3 x its weights and KV cache), twice: with the
entry's files in the page cache, and with them evicted from it first (posix_fadvise DONTNEED), beside the time a plain
read of those files takes from the disk, evicted alike. doc=true adds the table to the seven-b benchmark page.
"""

from __future__ import annotations

import json
import os
import shutil
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

from scripts import bench
from scripts.peer import cache_dir, decode_job, quantize_job
from src.common.metrics import markdown_table
from src.common.say import say
from src.common.settings import Setting
from src.models.gguf_names import TOP, gguf_name

# what each method's job is given (the default: precision=w4a16 as conf/precision/w4a16.yaml has it)
METHODS = {"rtn": ["precision.method=rtn", "precision.gptq=[]"], "default": []}

COMMAND = bench.command(
    "bench_seven_b",
    __doc__,
    [
        Setting("model", "llama-2-7b", "a shipped shape (src/shapes/) of the llama family"),
        Setting("methods", ("rtn", "default"), "quantspec's w4a16 methods: rtn, default (AWQ + GPTQ)"),
        Setting("rounds", 1, "rounds in turns"),
        Setting("doc", False, "add the table to docs/benchmarks/seven-b.md"),
    ],
    takes="",
)


def write_checkpoint(name: str, folder: Path) -> None:
    """Random bf16 weights at `name`'s published shape, a layer at a time (src.models.random_weights' values), as
    a sharded safetensors checkpoint."""
    import torch
    from safetensors.torch import save_file

    from src.models.random_weights import maker, random_model
    from src.quant.arch import decoder_layers, layer_prefix

    model, tokenizer = random_model(name, hollow=lambda m: {n for n, _ in m.named_parameters()})
    make = maker(model)
    layers = decoder_layers(model, "llama")
    groups = [[layer_prefix("llama", i) + n for n, _ in layer.named_parameters()] for i, layer in enumerate(layers)]
    groups.append([n for n, _ in model.named_parameters() if ".layers." not in n])
    work = folder.with_name(folder.name + ".partial")
    shutil.rmtree(work, ignore_errors=True)
    work.mkdir(parents=True)
    weight_map = {}
    for i, names in enumerate(groups):
        make(names)
        shard = f"model-{i + 1:05d}-of-{len(groups):05d}.safetensors"
        save_file({n: model.get_parameter(n).detach().contiguous() for n in names}, str(work / shard))
        weight_map.update({n: shard for n in names})
        for n in names:  # dropped again: one layer held at a time
            owner, _, leaf = n.rpartition(".")
            module = model.get_submodule(owner)
            param = module._parameters[leaf]
            module._parameters[leaf] = torch.nn.Parameter(torch.empty(param.shape, dtype=param.dtype, device="meta"))
    (work / "model.safetensors.index.json").write_text(json.dumps({"metadata": {}, "weight_map": weight_map}))
    model.config.save_pretrained(work)
    tokenizer.save_pretrained(work)
    work.rename(folder)


def write_f16_gguf(folder: Path, vocab: Path, path: Path) -> None:
    """The checkpoint's weights as an F16 GGUF (norms in F32, as llama.cpp's converter writes them), tensor by
    tensor, with the token list, scores and types of llama.cpp's Llama SPM vocabulary."""
    import gguf
    import numpy as np
    from safetensors import safe_open

    config = json.loads((folder / "config.json").read_text())
    index = json.loads((folder / "model.safetensors.index.json").read_text())["weight_map"]
    reader = gguf.GGUFReader(str(vocab))
    field = reader.fields["tokenizer.ggml.tokens"]
    tokens = [bytes(field.parts[i]).decode("utf-8", errors="replace") for i in field.data]
    scores = [
        float(reader.fields["tokenizer.ggml.scores"].parts[i][0]) for i in reader.fields["tokenizer.ggml.scores"].data
    ]
    types = [
        int(reader.fields["tokenizer.ggml.token_type"].parts[i][0])
        for i in reader.fields["tokenizer.ggml.token_type"].data
    ]
    if len(tokens) != config["vocab_size"]:
        raise ValueError(f"{vocab.name} holds {len(tokens)} tokens; the model's vocabulary is {config['vocab_size']}")
    hidden, heads = config["hidden_size"], config["num_attention_heads"]
    tmp = path.with_suffix(".partial")
    writer = gguf.GGUFWriter(str(tmp), arch="llama")
    writer.add_name(f"{folder.name} (random weights, F16)")
    writer.add_context_length(config["max_position_embeddings"])
    writer.add_embedding_length(hidden)
    writer.add_block_count(config["num_hidden_layers"])
    writer.add_feed_forward_length(config["intermediate_size"])
    writer.add_head_count(heads)
    writer.add_head_count_kv(config["num_key_value_heads"])
    writer.add_rope_dimension_count(hidden // heads)
    writer.add_layer_norm_rms_eps(config["rms_norm_eps"])
    writer.add_file_type(gguf.LlamaFileType.MOSTLY_F16)
    writer.add_tokenizer_model("llama")
    writer.add_token_list(tokens)
    writer.add_token_scores(scores)
    writer.add_token_types(types)
    writer.add_bos_token_id(1)
    writer.add_eos_token_id(2)
    writer.add_unk_token_id(0)
    order = sorted(index, key=lambda k: (k not in TOP or k == "lm_head.weight", k))
    shapes = {}
    for key in order:
        with safe_open(str(folder / index[key]), framework="pt") as f:
            shapes[key] = tuple(f.get_slice(key).get_shape())
    for key in order:
        f16 = len(shapes[key]) == 2
        dtype = np.float16 if f16 else np.float32
        count = int(np.prod(shapes[key]))
        writer.add_tensor_info(gguf_name(key), list(shapes[key]), np.dtype(dtype), count * np.dtype(dtype).itemsize)
    writer.write_header_to_file()
    writer.write_kv_data_to_file()
    writer.write_ti_data_to_file()
    for key in order:
        with safe_open(str(folder / index[key]), framework="pt") as f:
            value = f.get_tensor(key).float().numpy()
        writer.write_tensor_data(value.astype(np.float16 if value.ndim == 2 else np.float32))
    writer.close()
    tmp.rename(path)


def random_weights(name: str, home: Path, vocab: Path) -> tuple[Path, Path]:
    """(checkpoint folder, F16 GGUF) of random weights at `name`'s shape under `home`, each written once."""
    folder, f16 = home / f"{name}-random-bf16", home / f"{name}-random-f16.gguf"
    if not folder.is_dir():
        print(f"writing {folder}", flush=True)
        write_checkpoint(name, folder)
    if not f16.is_file():
        print(f"writing {f16}", flush=True)
        write_f16_gguf(folder, vocab, f16)
    return folder, f16


def evict(files: list[Path]) -> None:
    """Drop the files' clean pages from the page cache (no privileges needed; a page still mapped stays)."""
    for path in files:
        fd = os.open(path, os.O_RDONLY)
        try:
            os.fsync(fd)
            os.posix_fadvise(fd, 0, 0, os.POSIX_FADV_DONTNEED)
        finally:
            os.close(fd)


def disk_read_s(files: list[Path]) -> float:
    """Seconds to read the files whole from the disk (evicted first), 16 MB at a time."""
    evict(files)
    start = time.perf_counter()
    for path in files:
        with open(path, "rb", buffering=0) as f:
            while f.read(16 << 20):
                pass
    took = time.perf_counter() - start
    evict(files)
    return took


def timed(argv: list[str]) -> tuple[float, float]:
    """(wall seconds, peak resident GB) of a command, by /usr/bin/time."""
    with tempfile.NamedTemporaryFile("r", suffix=".time") as out:
        start = time.perf_counter()
        done = subprocess.run(["/usr/bin/time", "-f", "%M", "-o", out.name, *argv], capture_output=True, text=True)
        wall = time.perf_counter() - start
        if done.returncode != 0:
            raise RuntimeError(f"{argv[0]} failed: {(done.stderr or done.stdout).strip().splitlines()[-1:]}")
        return wall, int(Path(out.name).read_text().split()[-1]) / 2**20


def main(argv: list[str]) -> int:
    args, _ = bench.parse(COMMAND, argv)
    unknown = [m for m in args.methods if m not in METHODS]
    if unknown:
        say(f"methods={','.join(unknown)}: use {', '.join(METHODS)}", err=True)
        return 2
    cache = cache_dir()
    tools = cache / "tools" / "llama.cpp"
    quantizer, vocab = tools / "bin" / "llama-quantize", tools / "ggml-vocab-llama-spm.gguf"
    if not quantizer.is_file() or not vocab.is_file() or not Path("/usr/bin/time").is_file():
        say(
            f"no llama-quantize or vocabulary in {tools} (or no /usr/bin/time): `bash scripts/build_llama_server`",
            err=True,
        )
        return 2
    home = cache / "seven_b"
    folder, f16 = random_weights(args.model, home, vocab)
    store = f"sqlite:///{tempfile.mkdtemp(prefix='bench-seven-b-store-')}/mlflow.db"
    base = ["model=hub", f"model.local_path={folder}", "precision=w4a16"]
    entries = cache / "quantized"
    sweeps = home / "sweeps" / bench.stamp(args.model)
    rows: dict[str, list[tuple[float, float]]] = {"llama-quantize Q4_K_M": []}
    rows.update({f"quantspec w4a16 {m}": [] for m in args.methods})
    hits: list[tuple[float, float, float]] = []
    cold: list[tuple[float, float]] = []  # (the job's load, a plain read of its files), both from the disk
    for n in range(args.rounds):
        out = home / f"{args.model}-q4_k_m.gguf"
        rows["llama-quantize Q4_K_M"].append(timed([str(quantizer), str(f16), str(out), "Q4_K_M", "2"]))
        out.unlink()
        for m in args.methods:
            # quantized anew each round, from nothing: a killed run's partial entry (.<entry>.partial) too, or the
            # timing would be of a resumed build
            for entry in [*entries.glob(f"{folder.name}-*"), *entries.glob(f".{folder.name}-*.partial")]:
                shutil.rmtree(entry)
            job = quantize_job(store, sweeps / f"{n}-{m}", [*base, *METHODS[m]])[-1]
            rows[f"quantspec w4a16 {m}"].append((job.metrics["quantize_s"], job.metrics["peak_rss_gb"]))
        # timing only (random weights): no reference model to measure against
        hit_job = [*base, *METHODS[args.methods[-1]], "task.limit=2", "task.max_new_tokens=16", "task.reference=none"]
        hit = decode_job(store, sweeps / f"{n}-hit", hit_job)[-1]
        bound = 1.3 * (hit.metrics["weights_gb"] + hit.metrics.get("kv_cache_gb", 0.0))
        hits.append((hit.metrics["quant_load_s"], hit.metrics["peak_rss_gb"], bound))
        (entry,) = entries.glob(f"{folder.name}-*")
        files = sorted(entry.glob("*.safetensors"))
        read = disk_read_s(files)  # leaves them evicted
        cold.append((decode_job(store, sweeps / f"{n}-cold", hit_job)[-1].metrics["quant_load_s"], read))
        print(f"round {n + 1}: " + ", ".join(f"{k} {v[-1][0]:.0f} s" for k, v in rows.items()), flush=True)
    ref = statistics.median(s for s, _ in rows["llama-quantize Q4_K_M"])
    table = [
        [name, statistics.median(s for s, _ in v), max(g for _, g in v), statistics.median(s for s, _ in v) / ref]
        for name, v in rows.items()
    ]
    text = markdown_table(["quantizing", "wall s (median)", "peak GB (max)", "x llama-quantize"], table)
    text += "\n\n" + markdown_table(
        ["cache-hit job", "quant_load_s (median)", "peak_rss_gb (max)", "1.3 x (weights + KV) GB"],
        [[f"{args.methods[-1]}'s entry", statistics.median(h[0] for h in hits), max(h[1] for h in hits), hits[0][2]]],
    )
    text += "\n\n" + markdown_table(
        ["its files evicted from the page cache", "quant_load_s (median)", "disk read s (median)", "x disk read"],
        [
            [
                f"{args.methods[-1]}'s entry",
                statistics.median(c[0] for c in cold),
                statistics.median(c[1] for c in cold),
                statistics.median(c[0] / c[1] for c in cold),
            ]
        ],
    )
    about = (
        f"{args.model}'s shape, random weights (a bf16 safetensors checkpoint and an F16 GGUF of the same values), "
        f"{args.rounds} round(s) in turns: `python -m scripts.bench_seven_b {' '.join(argv)}`"
    )
    bench.publish(args.doc, "seven-b", f"Quantizing {args.model}", text, about, bench.stamp("seven-b"))
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
