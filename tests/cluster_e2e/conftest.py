"""Cluster end-to-end fixtures: the shared namespace lab."""

from tests.harness.fixtures import netns_lab  # noqa: F401
