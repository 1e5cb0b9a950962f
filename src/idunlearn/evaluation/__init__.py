"""Evaluation of generators before and after unlearning: identity metrics, kernel distance, quality."""
