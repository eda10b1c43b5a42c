"""Evaluation: one module per benchmark (loader, prompt, answer parser, metric), a runner and reports."""
