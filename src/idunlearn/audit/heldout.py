"""Seeds of the held-out attacks: the strong embedding attack, the inversion attack and the relearning
variants are never run inside any method's training, and they draw no random number that a training run could have
drawn. Their seeds are hashed (numpy SeedSequence) from the config seed, a stream number of their own and the
attack's name and index, so that they are never the run's seed, never a method's own stream (piu_robust's
``adversarial_seed`` hashes the run's seed with stream 15) and never an evaluation or audit seed (the config seed
plus offsets below a million); tests/test_audit_heldout.py checks the disjointness."""

from __future__ import annotations

import zlib

import numpy as np

HELDOUT_STREAM = 370  # the held-out attacks' seed stream beside the seed (piu_meta's attacker has 37, piu_robust's 15)
HELDOUT_ATTACKS = ("attack_heldout", "inversion", "relearning_heldout")
HELDOUT_RELEARNING = "relearning_heldout"  # rows' probe: relearning_heldout:<variant> (relearning_heldout.py)


def heldout_seed(seed: int, attack: str, key: int | str = 0) -> int:
    """The seed of stream ``key`` (an index, or a name such as a relearning variant's, hashed with CRC-32 so that
    adding a variant leaves the others' seeds alone) of held-out attack ``attack`` (one of ``HELDOUT_ATTACKS``) under
    the config seed ``seed``: a 32-bit value from SeedSequence([seed, 370, attack, key])."""
    if attack not in HELDOUT_ATTACKS:
        raise ValueError(f"held-out attack {attack!r} is unknown; known: {', '.join(HELDOUT_ATTACKS)}")
    key = zlib.crc32(key.encode()) if isinstance(key, str) else key
    return int(np.random.SeedSequence([seed, HELDOUT_STREAM, HELDOUT_ATTACKS.index(attack), key])
               .generate_state(1)[0])
