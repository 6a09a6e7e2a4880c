"""The plan, checked before any build: the target table and what it asks of every run.

targets   the target table of pyproject.toml, validated and frozen; each arch's other names
runners   each target's runs, by its table runner: natively per ISA level, under QEMU per CPU model
verdict   which runs run which tests (their scope), and the same tests on every run, proven from the JUnit reports
levels    each architecture's ladder, read from the level tables the build compiles from
ladders   every level of each ladder selected by a run of the table, or proven elsewhere

The verdict belongs to the plan: runners.py plans each run's tests with it (RunId,
designated(), SCOPE_MARKERS), and the host set-up already reads runners.py.
"""
