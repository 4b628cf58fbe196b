"""The public import path of :func:`make_sample_id` for tools outside packer.

The peer benchmark harness (``../shared/bench/adapters/packer_peer.py``) maps packer's sample ids
to its own keys with ``from packer.discover import make_sample_id``. The discover stage itself
lives in :mod:`packer.pipeline.discover`; this module only re-exports the one function.
"""

from packer.pipeline.discover import make_sample_id

__all__ = ["make_sample_id"]
