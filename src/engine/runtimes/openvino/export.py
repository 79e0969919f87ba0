"""Export a Hugging Face folder to OpenVINO with optimum-intel, compressing its weights with NNCF as the
precision asks. Run by src.engine.openvino in the export's own environment (.venv-ov: optimum-intel's
transformers), never imported by quantspec itself.

    python export.py HF_DIR OUT_DIR TARGET_JSON CALIBRATION_JSON

TARGET_JSON is runtime.target's: {"mode": "fp32" | "int8" | "int8_sq" (with "alpha") | "int4" (with "group_size",
"awq", "all_layers")}.
"""

import json
import sys


def main(hf_dir: str, out_dir: str, target: str, calibration: str) -> None:
    # optimum.intel's lazy top level wants torchvision (which breaks under torch 2.13): import from the module
    from optimum.intel.openvino import OVModelForCausalLM, OVQuantizationConfig, OVWeightQuantizationConfig

    texts = json.loads(open(calibration).read())
    t = json.loads(target)
    mode = t["mode"]
    if mode == "fp32":
        config = None
    elif mode == "int8":
        config = OVWeightQuantizationConfig(bits=8, sym=False)
    elif mode == "int4":
        # the precision's groups; the head (and embedding) at NNCF's int8 backup unless all_layers makes them 4-bit;
        # AWQ on quantspec's own calibration texts where asked (no data set is fetched: offline)
        common = dict(bits=4, sym=False, group_size=int(t["group_size"]), ratio=1.0, all_layers=bool(t["all_layers"]))
        awq = dict(awq=True, dataset=texts, num_samples=len(texts)) if t["awq"] and texts else {}
        config = OVWeightQuantizationConfig(**common, **awq)
    elif mode == "int8_sq" and texts:
        # NNCF's full quantization: SmoothQuant at quantspec's alpha, then int8 weights (symmetric, per
        # channel) and int8 activations (static ranges from the same calibration texts)
        config = OVQuantizationConfig(
            bits=8, sym=False, dataset=texts, num_samples=len(texts), smooth_quant_alpha=float(t["alpha"])
        )
    else:
        raise SystemExit(f"no export for {t!r} (int8_sq needs calibration texts)")
    model = OVModelForCausalLM.from_pretrained(
        hf_dir, export=True, compile=False, quantization_config=config, load_in_8bit=False, stateful=True,
        trust_remote_code=False,
    )  # fmt: skip
    model.save_pretrained(out_dir)


if __name__ == "__main__":
    main(*sys.argv[1:5])
