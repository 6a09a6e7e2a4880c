"""Errors a user fixes (a setting, a missing step, host set-up), as opposed to bugs:
nox shows their message alone, without a traceback."""


class HarnessError(RuntimeError):
    """Its message says what is wrong and what to do."""
