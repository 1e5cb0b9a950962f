"""Forgetting audit: is the person really gone? Calibrated verification (verification.py), the probe conditions
(probes.py), one audit job's generation, scoring and rows (run.py), and the audit's tables and figures (tables.py).
Sits above unlearning and evaluation and uses them; neither imports it."""
