"""What a model family is, said once: one file a family in this package, each declaring one Family (FAMILY), found
here by its name. Everything that must know a family reads its Family: the model's config
check (model.arch), the hub's and a GGUF's family (src.models.hub), the quantizers' layout (src.quant.arch), the
memory estimate, the tiny models, and the three step paths (src.engine.layers' one layer loop, which the Python step
and the static step both run, and the C++ step's setup, src.engine.cpp_step). Adding a family is adding its file here
(docs/how-to/add-model.md): nothing else names one.
"""

from src.models.families.description import (
    FAMILIES,
    HEAD,
    NAMES,
    Family,
    for_gguf,
    for_model_type,
    get,
    module_at,
    of,
)

__all__ = ["FAMILIES", "HEAD", "NAMES", "Family", "for_gguf", "for_model_type", "get", "module_at", "of"]
