"""The sixbit version, written into every checkpoint header."""

__version__ = "0.1.0"
