"""Quantization: pure maths (qparams), kernels, runtime linear modules, calibration, and the passes
(SmoothQuant, AWQ, RTN) that rewrite a float model into one that runs real int8/int4 kernels."""
