"""The pipeline: stages in order, the run directory, evaluation, studies, the CLI and benchmarks."""
