"""Unlearning methods (forget/retain objectives), optimisers (how the two become an update) and the run loop."""

from __future__ import annotations

from .base import UnlearningMethod
from .piu import PIU

METHODS: dict[str, type[UnlearningMethod]] = {PIU.name: PIU}


def build_method(name: str, params: dict) -> UnlearningMethod:
    try:
        return METHODS[name](params)
    except KeyError:
        raise ValueError(f"unlearning method {name!r} is unknown: use one of {', '.join(METHODS)}") from None
