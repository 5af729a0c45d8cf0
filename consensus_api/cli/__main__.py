"""``python -m consensus_api.cli``: the same as the ``consensus`` command."""

from consensus_api.cli import main

main()
