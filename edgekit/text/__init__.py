"""Text: the base model's WordPiece tokenizer, the normalizer compiled into SentencePiece, and the vocabulary
built from them. No torch."""
