"""Reference language models for difficulty grading: Kneser-Ney estimation, ARPA output, scorers."""
