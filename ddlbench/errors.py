"""Errors that ddlbench reports to users as one clear line, never as a traceback."""

from __future__ import annotations


class DdlbenchError(Exception):
    """A user-facing error: the message says what was wrong and what is accepted."""


class ConfigError(DdlbenchError):
    """A sweep configuration that does not validate; names the key, the bad value and the choices."""

    def __init__(self, key: str, message: str) -> None:
        self.key = key
        super().__init__(f"{key}: {message}" if key else message)
