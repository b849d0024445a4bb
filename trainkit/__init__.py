"""trainkit: make hand-written PyTorch training loops fast, and show with numbers what did it."""
__version__ = "0.1.0"
