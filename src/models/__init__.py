"""Models: which one (config), loaded from a GGUF package, the hub, a folder, or built in-process (tiny,
random weights at a published shape), and cached as safetensors + JSON."""
