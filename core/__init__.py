"""The bottom layer: what every other package may import and which imports none of them.

``core.errors``: :class:`~core.errors.PlatformError` (the base of every bad-input error) and the one-line-error
contract of the entry points; ``core.io``: atomic file writes.
"""
