"""Data: the formats a dataset may come in (formats), the loaded dataset and its splits (dataset), and the
training-time augmentation (augment). No torch."""
