"""edgekit: compress a pretrained encoder + an intent/slot dataset into an on-device package."""

__version__ = "0.4.0"
