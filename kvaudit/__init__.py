"""kvaudit: explain where an LLM inference server's GPU memory went, to the digit."""

__version__ = "0.1.0"
