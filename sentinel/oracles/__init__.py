"""Brute-force oracles: enumerate every structure of tiny inputs and score it directly from the conventions."""
