"""Assembling a job: the typed config (converted once at the entry), the command line's checks, the
hardware profile and placement, memory, the model and its weights, the corpus, and the job itself."""
