"""What the conformance plugin leaves in pytest's stash for the runner (``consensus conformance``).

A module of its own so that the runner reads it without importing the plugin
before pytest starts: pytest rewrites the assertions of a ``-p`` plugin only
if it imports the plugin itself.
"""

import pytest

#: Node ids of the tests the backend's profile declares not applicable, and why.
NOT_APPLICABLE = pytest.StashKey[dict[str, str]]()
