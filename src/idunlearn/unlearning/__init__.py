"""Unlearning methods (forget/retain objectives or a closed-form edit), optimisers (how the two objectives become
an update) and the run loop. One module per method; ``METHODS`` maps the config's ``method`` to its class."""

from __future__ import annotations

from ..config import method_settings
from .base import ClosedFormMethod, UnlearningMethod
from .esd import ESD
from .piu import PIU
from .piu_meta import PIUMeta
from .piu_robust import PIURobust
from .siss import SISS
from .uce import UCE
from .wid import WID

METHODS: dict[str, type[UnlearningMethod] | type[ClosedFormMethod]] = {
    cls.name: cls for cls in (PIU, SISS, UCE, WID, ESD, PIURobust, PIUMeta)}


def build_method(name: str, params: dict) -> UnlearningMethod | ClosedFormMethod:
    if name not in METHODS:
        raise ValueError(f"config key 'method': unlearning method {name!r} is unknown; use one of {', '.join(METHODS)}")
    # only the settings the schema declares for the method (x-reads): reading another one fails naming it
    return METHODS[name](method_settings(name, params))
