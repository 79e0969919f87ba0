"""ONNX Runtime GenAI's model builder, as `python -m onnxruntime_genai.models.builder` runs it, with one
fix: under transformers 5 a Gemma 3 config holds its two rope settings per attention type
(`rope_parameters = {full_attention: ..., sliding_attention: ...}`), where the builder reads one
`rope_parameters` and `rope_local_base_freq`. Its config is read with trust_remote_code=False, always. Run in its own process by src.engine.runtimes.ort_genai.export
(the builder is loud and holds the whole model in memory while it writes)."""

import sys

import onnxruntime_genai.models.builder as builder
from transformers import AutoConfig


class _FlatRope:
    @staticmethod
    def from_pretrained(*args, **kwargs):
        kwargs["trust_remote_code"] = False  # quantspec runs no model's own code, whatever the options say
        config = AutoConfig.from_pretrained(*args, **kwargs)
        rope = getattr(config, "rope_parameters", None)
        if isinstance(rope, dict) and "full_attention" in rope:
            config.rope_local_base_freq = rope["sliding_attention"]["rope_theta"]
            config.rope_parameters = dict(rope["full_attention"])
        return config


def main() -> None:
    builder.AutoConfig = _FlatRope
    args = builder.get_args()
    extra = builder.parse_extra_options(
        args.model_name,
        args.input,
        args.output,
        args.precision,
        args.execution_provider,
        args.cache_dir,
        args.extra_options,
        builder_config_version=args.builder_config_version,
        target_options=args.target_options,
        drafter_options=args.drafter_options,
        speculative_options=args.speculative_options,
        runtime_config=args.runtime_config,
        search=args.search,
    )
    builder.create_model(
        args.model_name, args.input, args.output, args.precision, args.execution_provider, args.cache_dir, **extra
    )


if __name__ == "__main__":
    sys.exit(main())
