"""A precision: the float parts' dtype, calibration's size and its quantization method's spec
(src.quant.methods), applied by src.quant.apply."""

from __future__ import annotations

from dataclasses import dataclass

from src.common.schema import ConfigError, check_choice, check_range
from src.models.config import ModelConfig
from src.quant import methods as quant_methods
from src.quant.methods import QuantSpec

DTYPES = ("float32", "bfloat16", "float16")
PREFILL_ACTIVATIONS = ("bf16", "int8")  # precision.prefill_activations (src.quant.linear.install_prefill_activations)
BATCH_ACTIVATIONS = ("int16", "int8")  # precision.batch_activations (src.engine.cpp_step.set_batch_activations)


MAX_CALIB_SAMPLES = 1 << 16
MAX_CALIB_SEQ_LEN = 1 << 20


@dataclass(frozen=True)
class PrecisionConfig:
    """A precision: the float parts' dtype, calibration's size, and its quantization method's spec (None
    for a float precision; one of src.quant.methods.METHODS, holding only that method's fields)."""

    name: str  # the choice's name (conf/precision/<name>.yaml)
    dtype: str  # the float parts' dtype (norms, attention, embedding)
    method: str  # none, or a method of src.quant.methods
    calib_samples: int  # calibration windows from the dataset's second half...
    calib_seq_len: int  # ...of this many tokens (their hash is part of the cache key)
    # a prefill's activations at the grouped linears (PREFILL_ACTIVATIONS): how the model runs,
    # not what its weights are, so not part of the cache key
    prefill_activations: str = "bf16"
    # a batched serving step's activations at the grouped linears (BATCH_ACTIVATIONS), likewise not a cache key
    batch_activations: str = "int16"
    quant: QuantSpec | None = None

    @property
    def quantized(self) -> bool:
        return self.quant is not None

    def spec(self, model: ModelConfig) -> QuantSpec:
        """The method's spec with what it takes from the model filled in (SmoothQuant's alpha)."""
        return self.quant.resolved(model)

    def validate(self) -> None:
        check_choice("precision.dtype", self.dtype, DTYPES)
        check_choice("precision.method", self.method, quant_methods.choices())
        check_choice("precision.prefill_activations", self.prefill_activations, PREFILL_ACTIVATIONS)
        check_choice("precision.batch_activations", self.batch_activations, BATCH_ACTIVATIONS)
        for key in ("calib_samples", "calib_seq_len"):
            if getattr(self, key) < 1:
                raise ConfigError(f"precision.{key}={getattr(self, key)} must be at least 1")
        # one calibration tensor holds samples x seq_len tokens (torch's sizes are int64; 2**60 had overflowed)
        check_range("precision.calib_samples", self.calib_samples, 1, MAX_CALIB_SAMPLES)
        check_range("precision.calib_seq_len", self.calib_seq_len, 1, MAX_CALIB_SEQ_LEN, "no model's context is longer")
        if self.quant is not None:
            self.quant.validate()
