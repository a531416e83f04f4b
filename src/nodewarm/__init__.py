"""nodewarm: make a freshly scaled-up GPU node serve vLLM in seconds instead of minutes."""

__version__ = "0.1.0"
