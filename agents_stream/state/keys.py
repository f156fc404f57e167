"""Moved: identity encoding is part of the durable core (:mod:`agents_stream.durable.keys`).

Kept so that imports written against earlier versions keep working.
"""

from ..durable.keys import *  # noqa: F403
