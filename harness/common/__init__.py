"""What every stage uses; imports nothing else of the harness.

paths     every path the harness reads or writes
project   the project's name (from pyproject.toml) and the names made from it
errors    errors a user fixes, shown without a traceback; a failed write named with its cause
console   running commands with visible progress, and timing each step of a run
"""
