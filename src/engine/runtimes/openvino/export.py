"""Export a Hugging Face folder to OpenVINO with optimum-intel, compressing its weights with NNCF as the
precision asks. Run by src.engine.openvino in the export's own environment (.venv-ov: optimum-intel's
transformers), never imported by quantspec itself.

    python export.py HF_DIR OUT_DIR fp32|int8|int4_awq|int8_sq CALIBRATION_JSON [ALPHA]
"""

import json
import sys


def main(hf_dir: str, out_dir: str, precision: str, calibration: str, alpha: str = "0.5") -> None:
    # optimum.intel's lazy top level wants torchvision (which breaks under torch 2.13): import from the module
    from optimum.intel.openvino import OVModelForCausalLM, OVQuantizationConfig, OVWeightQuantizationConfig

    texts = json.loads(open(calibration).read())
    if precision == "fp32":
        config = None
    elif precision == "int8":
        config = OVWeightQuantizationConfig(bits=8, sym=False)
    elif precision == "int4_awq":  # AWQ on quantspec's own calibration texts (no data set is fetched: offline)
        config = (
            OVWeightQuantizationConfig(
                bits=4, sym=False, group_size=128, ratio=1.0, awq=True, dataset=texts, num_samples=len(texts)
            )
            if texts
            else OVWeightQuantizationConfig(bits=4, sym=False, group_size=128, ratio=1.0)
        )
    elif precision == "int8_sq" and texts:
        # NNCF's full quantization: SmoothQuant at quantspec's alpha, then int8 weights (symmetric, per
        # channel) and int8 activations (static ranges from the same calibration texts)
        config = OVQuantizationConfig(
            bits=8, sym=False, dataset=texts, num_samples=len(texts), smooth_quant_alpha=float(alpha)
        )
    else:
        raise SystemExit(f"no export for {precision!r} (int8_sq needs calibration texts)")
    model = OVModelForCausalLM.from_pretrained(
        hf_dir, export=True, compile=False, quantization_config=config, load_in_8bit=False, stateful=True,
        trust_remote_code=False,
    )  # fmt: skip
    model.save_pretrained(out_dir)


if __name__ == "__main__":
    main(*sys.argv[1:6])
