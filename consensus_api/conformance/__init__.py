"""The consensus-api contract as a pytest suite (SPEC section 10).

Run it against any backend URL::

    pytest --pyargs consensus_api.conformance --consensus-url=sqlite:////tmp/ct.db
    consensus conformance etcd://127.0.0.1:2379/ct

The plugin (``consensus_api.conformance.plugin``) is loaded by the ``pytest11``
entry point; ``--consensus-url`` may also come from ``$CONSENSUS_URL`` and
``--consensus-option NAME=VALUE`` sets a connection option for every session
(e.g. a longer ``session_timeout`` for a backend whose minimum is higher).
One module per SPEC section; the section's name is the module name without
``test_`` (a section may go on in ``test_<section>_<more>.py``). Every test
namespaces its keys, groups and services uniquely, so the suite never depends
on (or wipes) what the backend already holds.
"""

#: The sections of the suite, in SPEC order: ``test_<section>.py`` each.
SECTIONS = (
    "storage",
    "listeners",
    "membership",
    "election",
    "session",
    "concurrency",
    "errors",
    "faults",
    "coordinator",
)
