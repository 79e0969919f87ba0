"""The quantization methods a precision names (precision.method), each one class registered once: its own
fields, its validation, what its calibration costs in memory, and its scaling pass.

A method's spec is what changes its quantized weights, so it is the cache key (src.quant.cache): a field
of AWQ's does not re-key a SmoothQuant cache. What every method shares is the mix of low-bit formats
(`QuantSpec`). Light: the passes import torch only when they run.

Adding a method: a subclass of QuantSpec with KIND, registered in METHODS, whose `scale_layer` rewrites one float
layer before it is rounded, from what that layer's forward met (src.quant.stream calls it, layer by layer), and its
fields in conf/precision/_fields.yaml.
"""

from __future__ import annotations

from dataclasses import dataclass, replace
from typing import ClassVar

from src.common.schema import ConfigError, Kinds, check_choice, check_range
from src.models.families import HEAD
from src.quant import awq, formats, smoothquant
from src.quant.arch import layer_awq_groups, layer_smooth_groups
from src.quant.stream import Scaled

METHODS = Kinds("precision", "method")
CALIB_INPUTS = ("rounded", "float")


@dataclass(frozen=True, kw_only=True)
class QuantSpec:
    """What every method shares: which low-bit format each linear runs. The defaults live in
    conf/precision/_fields.yaml, nowhere else."""

    KIND: ClassVar[str]
    CALIBRATES: ClassVar[bool] = True  # its pass reads calibration windows (their hash is part of the cache key)
    OBSERVES_ABSMAX: ClassVar[bool] = False  # its pass reads each input channel's max |x| (SmoothQuant's)
    method: str
    format: str  # the decoder linears' format (one of src.quant.formats)
    group_size: int | None  # a grouped format's groups along the input features
    quantize_head: bool  # False keeps the output head in float
    head_format: str | None  # the head's format where it differs from the layers' (w4a16 + w8a16 head)
    wide_linears: tuple[str, ...]  # decoder linears (name suffixes) kept wider under a grouped format...
    wide_format: str  # ...in this format: w8a16 (int8), w6a16 or w5a16 (three quarters or five eighths of int8's bytes)
    gptq: tuple[str, ...]  # linears (name suffixes; lm_head: the output head; *: all) rounded by GPTQ, not to nearest
    gptq_wide: bool  # whether GPTQ rounds the wide linears it names too (false: they round to nearest)
    # what each layer is calibrated on: what the rounded layers before it pass on (a second forward a layer, through
    # its rounded weights), or the float model's own states (the first forward's outputs, passed on)
    calib_inputs: str

    @property
    def calibrates(self) -> bool:
        """Whether quantizing reads calibration windows: the method's own pass, or GPTQ's inputs."""
        return self.CALIBRATES or bool(self.gptq)

    def format_for(self, name: str) -> str:
        if name == HEAD:
            return self.head_format or self.format
        return self.wide_format if self.is_wide(name) else self.format

    def is_wide(self, name: str) -> bool:
        """Whether decoder linear `name` is kept in the wide format (wide_linears, under a grouped format)."""
        return formats.get(self.format).grouped and name.endswith(tuple(self.wide_linears))

    @property
    def grouped(self) -> bool:
        """Whether the decoder's linears quantize in groups (AWQ and RTN's low-bit formats)."""
        return formats.get(self.format).grouped

    def validate(self) -> None:
        check_choice("precision.calib_inputs", self.calib_inputs, CALIB_INPUTS)
        check_choice("precision.format", self.format, formats.names())
        if self.head_format is not None:
            check_choice("precision.head_format", self.head_format, formats.names())
        check_choice("precision.wide_format", self.wide_format, formats.names())
        # the fields that ask for a grouped format, the layers' first: the one to blame where groups are missing
        wider = self.wide_format if self.grouped and self.wide_linears else None
        fields = (("format", self.format), ("head_format", self.head_format), ("wide_format", wider))
        asked = [(k, v) for k, v in fields if v in formats.grouped()]
        if asked and self.group_size is None:
            key, name = asked[0]
            raise ConfigError(
                f"precision.{key}={name} is a {formats.get(name).bits}-bit format, which quantizes in groups, "
                f"and this precision sets none; add precision.group_size= one of: {', '.join(map(str, formats.GROUPS))}"
            )
        if asked and self.group_size not in formats.GROUPS:
            raise ConfigError(
                f"precision.group_size={self.group_size} is not one the grouped kernels run; "
                f"use one of: {', '.join(map(str, formats.GROUPS))}"
            )

    def resolved(self, model) -> QuantSpec:
        """The spec with what it takes from the model (a ModelConfig) filled in: SmoothQuant's alpha."""
        return self

    def search_tokens(self) -> int | None:
        """Calibration tokens whose inputs its pass reads row by row (AWQ's sample), or None."""
        return None

    def scale_layer(self, model, arch: str, index: int, linears: dict, seen):
        """Rewrite decoder layer `index` (its quantized `linears` by name) before it is rounded, from what its
        forward met (src.quant.stream.Seen): a src.quant.stream.Scaled."""
        return Scaled()

    def calibration_bytes(self, shape) -> int:
        """Memory the layer-by-layer pass holds beyond the model's float parts outside its layers, for a model of
        `shape`: one layer in float (bf16), the windows' hidden states, and where GPTQ rounds, one layer's Grams in
        float32 (three of hidden x hidden and one of the MLP's width squared; its factor and working copy beside
        the largest) and, where GPTQ rounds the head, its float32 working copy and their transpose, and its
        rounded values as they are packed."""
        hidden = shape.hidden_size
        inner = getattr(shape, "intermediate_size", None) or shape.ffn_dim
        layer = (4 * hidden * hidden + 3 * hidden * inner) * 2
        states = 16 * 256 * (2 * hidden + 2 * inner) * 4  # the windows' states, a layer's activations over them
        total = layer + states
        if self.gptq:  # (an upper bound where gptq_wide leaves the MLP's output projection out: its Gram is not formed)
            total += (3 * hidden * hidden + 3 * inner * inner + inner * hidden) * 4
        if HEAD in self.gptq or "*" in self.gptq:  # GPTQ's float32 copy and its transpose, q twice, the packing
            total += shape.vocab_size * hidden * (2 * 4 + 3)
        return total


@METHODS.register
@dataclass(frozen=True, kw_only=True)
class SmoothQuant(QuantSpec):
    """Activation outliers moved into the weights by per-channel scales, for 8-bit formats."""

    KIND: ClassVar[str] = "smoothquant"
    OBSERVES_ABSMAX: ClassVar[bool] = True
    alpha: float | None  # migration strength; null: the model's smoothquant_alpha

    def validate(self) -> None:
        super().validate()
        if self.grouped:
            raise ConfigError(f"precision.method=smoothquant is for 8-bit kernels; use awq or rtn for {self.format}")
        if self.alpha is not None and not 0 <= self.alpha <= 1:
            raise ConfigError(f"precision.alpha={self.alpha} must be in [0, 1]")

    def resolved(self, model):
        if self.alpha is not None:
            return self
        if model.smoothquant_alpha is None:
            # a model of one's own (model=hub, model=gguf) has no entry of its own in conf/model/ to hold it
            where = "=0.5" if model.own else f" in conf/model/{model.name}.yaml"
            raise ConfigError(
                f"model {model.name} has no smoothquant_alpha; set precision.alpha=0.5 (or model.smoothquant_alpha{where})"
            )
        return replace(self, alpha=model.smoothquant_alpha)

    def scale_layer(self, model, arch, index, linears, seen):
        return smoothquant.smooth_layer(layer_smooth_groups(model, arch, index), seen, self.alpha)


@METHODS.register
@dataclass(frozen=True, kw_only=True)
class Awq(QuantSpec):
    """Activation-aware scales searched per group of linears, then a clipping search, for int4 weights."""

    KIND: ClassVar[str] = "awq"
    awq_grid: int  # exponents r = 0, 1/grid, ... for s = mean|x|^r
    awq_clip: bool
    awq_search_tokens: int  # calibration tokens the scale search scores
    awq_search_rows: int | None  # output channels sampled per scale search (null: all)
    awq_block_loss: bool

    def validate(self) -> None:
        super().validate()
        if not self.grouped:
            raise ConfigError(
                f"precision.method=awq is for grouped low-bit weights ({', '.join(formats.grouped())}), "
                f"not precision.format={self.format}"
            )
        if self.awq_search_rows is not None and self.awq_search_rows < 1:
            raise ConfigError(f"precision.awq_search_rows={self.awq_search_rows} must be at least 1 (or null: all)")
        for key in ("awq_grid", "awq_search_tokens"):
            if getattr(self, key) < 1:
                raise ConfigError(f"precision.{key}={getattr(self, key)} must be at least 1")
        # the grid is the scale search's trials per layer (each a forward): past this the search never ends
        check_range("precision.awq_grid", self.awq_grid, 1, 1000)

    def search_tokens(self):
        return self.awq_search_tokens

    def scale_layer(self, model, arch, index, linears, seen):
        # the clipping search is at the layers' bits: the linears kept wider (wide_linears) are not clipped
        low = {n for n in linears if self.format_for(n) == self.format}
        fmt = formats.get(self.format)
        return awq.awq_layer(
            layer_awq_groups(model, arch, index),
            linears,
            seen,
            index,
            self.group_size,
            self.awq_grid,
            self.awq_clip,
            self.awq_block_loss,
            clip_only=low,
            search_rows=self.awq_search_rows,
            act_int8=fmt.act_bits == 8,
            bits=fmt.bits,
        )

    def calibration_bytes(self, shape):
        """One layer's sampled inputs (bf16, as the model) and, while a group's scales are searched, a few float32
        copies of its (sampled) rows and outputs; and the clipping search's float32 copies of one linear."""
        hidden = shape.hidden_size
        inner = getattr(shape, "intermediate_size", None) or shape.ffn_dim
        tokens = self.awq_search_tokens
        captured = tokens * (3 * hidden + inner) * 2
        rows = min(self.awq_search_rows or 2 * inner, 2 * inner)
        clip = 4 * inner * hidden * 4
        return captured + 6 * rows * inner * 4 + 3 * tokens * 2 * inner * 4 + clip + super().calibration_bytes(shape)


@METHODS.register
@dataclass(frozen=True, kw_only=True)
class Rtn(QuantSpec):
    """Round to nearest: no scaling, no data; the baseline the other methods must beat."""

    KIND: ClassVar[str] = "rtn"
    CALIBRATES: ClassVar[bool] = False


def choices() -> tuple[str, ...]:
    """precision.method's values: none (a float precision) or a registered method."""
    return ("none", *METHODS.names)
