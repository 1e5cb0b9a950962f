"""idunlearn: identity unlearning for face generators and recognizers."""

__version__ = "0.1.0"
