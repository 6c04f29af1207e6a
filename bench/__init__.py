"""Side-by-side benchmarks against peer libraries: ``python -m bench [--only TOPIC] [--quick]``."""
