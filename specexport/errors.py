"""The exception family every part of specexport raises for things a user or a bundle can cause.

Pure Python, imported by everything (bundle, runtime, exporter, server, CLI); imports nothing of ours.
Callers catch `SpecExportError` for all of them; the classes that are about a bad value also subclass
ValueError, so code written against the plain built-in keeps working. Anything else that escapes is a bug.
"""
from __future__ import annotations


class SpecExportError(Exception):
    """Base of every error specexport raises on purpose; the message names the problem and the fix."""


class BundleError(SpecExportError, ValueError):
    """A bundle that cannot be used as it is (malformed, tampered, unsafe); the message says what to rebuild."""


class OptionError(SpecExportError, ValueError):
    """A bad argument to the API or the CLI (type, range, or not supported by this bundle)."""


class PromptTooLong(OptionError):
    """A prompt (plus max_new_tokens) that does not fit the bundle's cache capacity."""


class QueueFull(SpecExportError):
    """The engine's waiting queue is at its bound: try again later (a server answers 429)."""


class EngineClosed(SpecExportError):
    """The engine is draining or stopped and takes no new requests (a server answers 503)."""


class GenerationError(SpecExportError):
    """A request that failed while it ran (e.g. a stop callback raised); only that request ends."""


class BuildError(SpecExportError):
    """A build that cannot write its bundle (disk full, read-only or unwritable output, a live build at the
    same --out); nothing half-written is left at --out."""


class TemplateError(OptionError):
    """A chat template that refused the messages (its raise_exception), failed on them, or was stopped at a
    limit (render time, output size, characters computed); the message says which."""
