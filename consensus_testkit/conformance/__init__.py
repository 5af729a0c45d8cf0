"""The consensus-api contract as a pytest suite, and a pytest plugin to run it.

Contract: <https://consensus-api.github.io/consensus-api/spec/#10-conformance>

Run it against any backend URL, with the test kit installed (``pip install
'consensus-api[sql,conformance]'``: pytest and every module the suite imports)::

    consensus conformance etcd://127.0.0.1:2379/ct
    pytest -p consensus_testkit.conformance --pyargs consensus_testkit.conformance --consensus-url=sqlite:////tmp/ct.db

The plugin is opt-in: ``-p consensus_testkit.conformance`` on pytest's command
line, or ``pytest_plugins = ["consensus_testkit.conformance"]`` in a
``conftest.py``, loads ``consensus_testkit.conformance.plugin`` (this package names
it in ``pytest_plugins``; importing the package does not import pytest). A
pytest run that does not ask for it sees none of its options or fixtures.
``--consensus-url`` may also come from ``$CONSENSUS_URL`` and
``--consensus-option NAME=VALUE`` sets a connection option for every session
(e.g. a longer ``session_timeout`` for a backend whose minimum is higher).
What each backend needs - its server, detection delay, server-side expiry,
what does not apply - is its test profile (``consensus_testkit.profile``).
One module per section of the contract; the section's name is the module name without
``test_`` (a section may go on in ``test_<section>_<more>.py``). Every test
namespaces its keys, groups and services uniquely, so the suite never depends
on (or wipes) what the backend already holds.
"""

#: Loaded by pytest when this package is a plugin (``-p consensus_testkit.conformance``).
pytest_plugins = ["consensus_testkit.conformance.plugin"]

#: The sections of the suite, in the contract's order: ``test_<section>.py`` each.
SECTIONS = (
    "storage",
    "listeners",
    "membership",
    "election",
    "locks",
    "session",
    "concurrency",
    "errors",
    "faults",
    "coordinator",
    "security",
    "aio",
    "migration",
)
