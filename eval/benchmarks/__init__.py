"""Benchmarks, one module each: loader of the dataset's format, prompt, answer parser, metric."""
