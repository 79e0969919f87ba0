"""Export a Hugging Face folder to OpenVINO with optimum-intel, compressing its weights with NNCF as the
precision asks. Run by src.engine.openvino in the export's own environment (.venv-ov: optimum-intel's
transformers), never imported by quantspec itself.

    python openvino_export.py HF_DIR OUT_DIR fp32|int8|int4_awq CALIBRATION_JSON
"""

import json
import sys


def main(hf_dir: str, out_dir: str, precision: str, calibration: str) -> None:
    # optimum.intel's lazy top level wants torchvision (which breaks under torch 2.13): import from the module
    from optimum.intel.openvino import OVModelForCausalLM, OVWeightQuantizationConfig

    texts = json.loads(open(calibration).read())
    config = {
        "fp32": None,
        "int8": OVWeightQuantizationConfig(bits=8, sym=False),
        # AWQ on quantspec's own calibration texts (no data set is fetched: the run is offline)
        "int4_awq": OVWeightQuantizationConfig(bits=4, sym=False, group_size=128, ratio=1.0, awq=True,
                                               dataset=texts, num_samples=len(texts)) if texts else
                    OVWeightQuantizationConfig(bits=4, sym=False, group_size=128, ratio=1.0),
    }[precision]
    model = OVModelForCausalLM.from_pretrained(hf_dir, export=True, compile=False, quantization_config=config,
                                               load_in_8bit=False, stateful=True)
    model.save_pretrained(out_dir)


if __name__ == "__main__":
    main(*sys.argv[1:5])
