"""deploybench: reproduce DeepLearningExamples' Triton deployment benchmarks with Snakemake."""

__version__ = "0.1.0"
