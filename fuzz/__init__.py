"""Coverage-guided fuzz harnesses (atheris/libFuzzer) for the wire core; see ``fuzz/README.md``."""
