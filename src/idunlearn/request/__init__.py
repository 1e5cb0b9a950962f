"""Forget requests: a folder of photos of one person in, an unlearned model and a one-page forgetting report out
(photos.py: which photos are the requester's; selection.py: in the training data or not, anchor, retain sets;
assess.py: unlearning, before/after evaluation and light audit; report.py: the report)."""
