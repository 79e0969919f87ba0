"""quantspec's benchmark scripts and docs checks, run as modules from the project's root:
`.venv/bin/python -m scripts.bench_quant --help`. What they share is in scripts/bench.py."""
