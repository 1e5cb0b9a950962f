"""Recognizer track: forget a person in a face-recognition classifier (GSUO against the usual baselines).

Modules: ``data`` (ORL face tensors from the aligned crops, Fashion-MNIST from the Debian package, splits and forget
sets), ``models`` (small CNN feature extractor + linear head), ``training`` (original and retrain references),
``methods`` (GSUO and the baselines), ``mia`` (likelihood-ratio membership inference with shadow models),
``metrics`` (accuracies, |Diff|, F_acc, speedup, paper-style tables and the speedup-versus-F_acc plot) and
``runs`` (one experiment: every method on one forget set).
"""
