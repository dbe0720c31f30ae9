"""Benchmarks: kernel and end-to-end timings on a GPU, written as JSON with a plot beside it."""
