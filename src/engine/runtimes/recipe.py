"""What a precision is, read from its settings, never from its name: the formats its linears run (weight bits,
activation bits, group size), the method that finds them, GPTQ's rounding, the float parts' dtype. Another runtime
(OpenVINO, ONNX Runtime GenAI, llama.cpp) exports the float model and quantizes it its own way, so it maps this to its
own options, and refuses in one line, naming the field, what it cannot express: a precision under another name, or a
shipped one with other settings (precision.group_size=64), is then exported as what it is, or refused.
"""

from __future__ import annotations

from dataclasses import dataclass

from src.models.families import HEAD
from src.quant import formats


@dataclass(frozen=True)
class Linears:
    """The weight format a precision field gives some linears, as it names it (`field`=`name`, for a refusal's line)."""

    field: str
    name: str
    bits: int  # weight bits
    act_bits: int  # 16: weight-only; 8: activations rounded per token
    group: int | None  # grouped formats' group size along the input features; None: int8 per output channel


@dataclass(frozen=True)
class Recipe:
    dtype: str  # the float parts' (float32, bfloat16, float16)
    method: str  # none, smoothquant, awq, rtn
    layers: Linears | None  # the decoder linears' format; None: a float precision
    head: Linears | None  # the output head's; None: the head stays float
    wide_linears: tuple[str, ...]  # decoder linears (name suffixes) kept in...
    wide_format: Linears | None  # ...this format, where any are
    gptq: tuple[str, ...]  # linears GPTQ rounds (lm_head: the head; *: all)
    alpha: float | None  # SmoothQuant's migration strength


def _format(field: str, name: str, group: int | None) -> Linears:
    fmt = formats.get(name)
    return Linears(field, name, fmt.bits, fmt.act_bits, group if fmt.grouped else None)


def of(cfg) -> Recipe:
    """The job's precision (a JobConfig's) as a Recipe."""
    precision = cfg.precision
    if not precision.quantized:
        return Recipe(precision.dtype, "none", None, None, (), None, (), None)
    spec = precision.spec(cfg.model)
    layers = _format("precision.format", spec.format, spec.group_size)
    head = None
    if spec.quantize_head:
        field = "precision.head_format" if spec.head_format else "precision.format"
        head = _format(field, spec.format_for(HEAD), spec.group_size)
    wide_linears = tuple(spec.wide_linears) if layers.group is not None else ()
    wide_format = _format("precision.wide_format", spec.wide_format, spec.group_size) if wide_linears else None
    return Recipe(
        precision.dtype,
        spec.method,
        layers,
        head,
        wide_linears,
        wide_format,
        tuple(spec.gptq),
        getattr(spec, "alpha", None),
    )


class Inexpressible(ValueError):
    """What a runtime cannot express of a recipe, in one line naming the field (the job's skip reason)."""


def refusal(cfg, mapping) -> str | None:
    """Why `mapping` (a runtime's map of a Recipe to its own options: raises Inexpressible) cannot express the job's
    precision, in one line, or None."""
    try:
        mapping(of(cfg))
    except Inexpressible as why:
        return str(why)
    return None


def refuse_gptq_and_bits(r: Recipe, engine: str, rounding: str, bits: tuple[int, ...] = (4, 8)) -> None:
    """What two runtimes refuse alike: GPTQ's rounding (theirs is `rounding`), and any format whose weight bits are
    not among `bits` (the layers', the wide linears', the head's), each in one line naming the field."""
    if r.gptq:
        raise Inexpressible(
            f"engine {engine}'s {rounding}, not by GPTQ: precision.gptq={list(r.gptq)}; set precision.gptq=[]"
        )
    for f in (r.layers, r.wide_format, r.head):
        if f is not None and f.bits not in bits:
            raise Inexpressible(f"engine {engine} has no {f.bits}-bit weights: {f.field}={f.name}")


def describe(f: Linears) -> str:
    """A format in words: "4-bit weights in groups of 128, 16-bit activations"."""
    where = f"in groups of {f.group}" if f.group else "per output channel"
    return f"{f.bits}-bit weights {where}, {f.act_bits}-bit activations"
