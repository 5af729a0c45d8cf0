"""Benchmarks of consensus-api against raw clients and OpenStack tooz, on the same servers, in one run.

``consensus bench URL [--json] [--quick]`` runs every workload against one
backend; ``benchmarks/run`` starts every server and runs it for each backend.
Each ours-vs-baseline pair is measured interleaved in the same run, so load
from other processes hits both sides alike; ratios are the result, absolute
numbers are only indicative. Speed and memory targets live here, never in
timed tests. See docs/performance.md.
"""
