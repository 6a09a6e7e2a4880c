"""What the runs proved, kept: the summary, the test records, every shipped level proven.

summary   the closing table (Markdown and JSON) from JUnit reports, with the cross-run verdict
records   the test records: written by a run, sealed by a digest, added from other machines
gate      every level a wheel ships proven by a passing run of its bytes
prove     a record from any Linux machine: the suite at every level its CPU has, no Docker

The gate is here, beside the records it reads (`nox -s records` prints its table);
publishing/ asks it before any upload.
"""
