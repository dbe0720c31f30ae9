"""Evaluation: perplexity on a text file, and the audit of a trit checkpoint."""
