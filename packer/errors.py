"""The project's exception types; the CLI maps each to a documented exit code.

A defect of one sample is not an exception: it is an :class:`packer.records.Issue`.
These are defects of the run.
"""

from __future__ import annotations


class PackerError(Exception):
    """Base class. ``exit_code`` is what ``packer`` exits with when this escapes."""

    exit_code = 1


class ConfigError(PackerError):
    """The job file or a command-line option is wrong: names the key path and the fix."""

    exit_code = 2


class BadFractionError(PackerError):
    """More bad samples than ``validate.max_bad_fraction`` allows (report still written)."""

    exit_code = 3


class LeakageError(PackerError):
    """The split audit found an entity (or duplicate) in two splits."""

    exit_code = 4


class IntegrityError(PackerError):
    """A shard or manifest does not match its recorded hash, size or schema."""

    exit_code = 5
