"""Can ONNX Runtime's MatMulNBits run quantspec's own int4 weights? Side by side, in turns, one process.

quantspec's int4 groups keep each group's minimum exactly (w = q*s + min: src.quant.qparams), a float
zero point; MatMulNBits' own layout is an integer (uint4) zero point, w = (q - z)*s. The op also takes
float zero points. This times one gemv (1 x K by K x N, group 128) three ways on the CPU provider and
says how far each is from quantspec's weights:

  float zero point, accuracy level 4 and 0: quantspec's weights exactly;
  uint4 zero point (the minimum rounded to the grid), level 4: ORT's fast path, other weights.

    .venv/bin/python -m scripts.bench_ort_zero_points rounds=5
"""

from __future__ import annotations

import statistics
import sys
import time

import numpy as np

from scripts import bench
from src.common import benchpage
from src.common.settings import Setting


def session(packed, scale, zero, k: int, n: int, block: int, level: int):
    import onnxruntime as ort
    from onnx import TensorProto, helper, numpy_helper

    inits = [
        numpy_helper.from_array(packed, "B"),
        numpy_helper.from_array(scale.reshape(-1), "S"),
        numpy_helper.from_array(zero.reshape(-1), "Z"),
    ]
    node = helper.make_node(
        "MatMulNBits",
        ["A", "B", "S", "Z"],
        ["Y"],
        domain="com.microsoft",
        K=k,
        N=n,
        bits=4,
        block_size=block,
        accuracy_level=level,
    )
    graph = helper.make_graph(
        [node],
        "gemv",
        [helper.make_tensor_value_info("A", TensorProto.FLOAT, [1, k])],
        [helper.make_tensor_value_info("Y", TensorProto.FLOAT, [1, n])],
        inits,
    )
    model = helper.make_model(
        graph, opset_imports=[helper.make_opsetid("", 17), helper.make_opsetid("com.microsoft", 1)]
    )
    options = ort.SessionOptions()
    options.intra_op_num_threads = 1
    return ort.InferenceSession(model.SerializeToString(), options, providers=["CPUExecutionProvider"])


COMMAND = bench.command(
    "bench_ort_zero_points",
    __doc__,
    [
        Setting("k", 2048, "the gemv's K"),
        Setting("n", 2048, "the gemv's N"),
        Setting("rounds", 5, "rounds in turns"),
        Setting("calls", 100, "gemvs per timing"),
    ],
    takes="",
)


def main(argv: list[str]) -> None:
    args, _ = bench.parse(COMMAND, argv)
    k, n, block = args.k, args.n, 128
    rng = np.random.default_rng(0)
    # quantspec's form: q in 0..15, a float scale and a float minimum per group
    w = rng.standard_normal((n, k)).astype(np.float32) * 0.02
    groups = w.reshape(n, k // block, block)
    lo, hi = groups.min(-1), groups.max(-1)
    scale = ((hi - lo) / 15).astype(np.float32)
    q = np.clip(np.round((groups - lo[..., None]) / scale[..., None]), 0, 15).astype(np.uint8).reshape(n, k)
    ours = (q.reshape(n, k // block, block) * scale[..., None] + lo[..., None]).reshape(n, k)
    packed = (q[:, 0::2] | (q[:, 1::2] << 4)).astype(np.uint8).reshape(n, k // block, block // 2)
    float_zero = (-lo / scale).astype(np.float32)
    int_zero = np.clip(np.round(float_zero), 0, 15).astype(np.uint8)
    int_zero = (int_zero[:, 0::2] | (int_zero[:, 1::2] << 4)).astype(np.uint8)
    ways = {
        "float zero point, accuracy level 4": session(packed, scale, float_zero, k, n, block, 4),
        "float zero point, accuracy level 0": session(packed, scale, float_zero, k, n, block, 0),
        "uint4 zero point, accuracy level 4": session(packed, scale, int_zero, k, n, block, 4),
    }
    x = rng.standard_normal((1, k)).astype(np.float32)
    ref = x @ ours.T
    error = {name: float(np.abs(s.run(None, {"A": x})[0] - ref).max() / np.abs(ref).max()) for name, s in ways.items()}
    times: dict[str, list[float]] = {name: [] for name in ways}
    for _ in range(args.rounds):
        for name, s in ways.items():  # in turns: each round times every way once
            start = time.perf_counter()
            for _ in range(args.calls):
                s.run(None, {"A": x})
            times[name].append((time.perf_counter() - start) / args.calls * 1e3)
    fast = statistics.median(times["uint4 zero point, accuracy level 4"])
    import onnxruntime

    about = (
        f"MatMulNBits 1 x {k} by {k} x {n}, int4 groups of {block}, one thread, {args.rounds} rounds in turns, "
        f"onnxruntime {onnxruntime.__version__}"
    )
    lines = [
        "| way | ms per gemv, median (min-max) | / uint4 level 4 | max error / max output, against quantspec's weights |",
        "|---|---|---|---|",
    ]
    for name, values in times.items():
        lines.append(
            f"| {name} | {statistics.median(values):.3f} ({min(values):.3f}-{max(values):.3f}) | "
            f"{statistics.median(values) / fast:.1f} | {error[name]:.1e} |"
        )
    print(about)
    print("\n".join(lines))
    benchpage.record(
        args.doc,
        "runtimes",
        "MatMulNBits with quantspec's float zero points",
        about + "\n\n" + "\n".join(lines),
        rounds=args.rounds,
    )


if __name__ == "__main__":
    main(sys.argv[1:])
