"""Shared multi-node test harness: network namespaces, real processes, faults (see netns.py)."""
