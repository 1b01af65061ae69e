"""ampbench: measure what mixed precision does to a PyTorch training job, against a strict float32 baseline.

The library behind the DVC stages in ``pipeline/``; see README.md and docs/ for the pipeline itself.
"""

__version__ = "0.1.0"
