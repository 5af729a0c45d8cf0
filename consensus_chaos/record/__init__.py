"""Recording histories of real clients under faults (``consensus chaos``).

``runner.run_chaos`` leaves one Parquet file per run in its output directory,
in the format of ``docs/history-format.md``; ``consensus_chaos.check`` checks
it. Importing ``schema`` or ``convert`` needs only pyarrow; starting servers
needs the ``testing`` extra (``consensus_testkit``), imported only when used.
"""
