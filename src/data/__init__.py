"""Text a job reads: the data set (config) and the corpus cut from it: calibration windows, benchmark prompts,
perplexity windows, the seed prompts and HumanEval's problems."""
