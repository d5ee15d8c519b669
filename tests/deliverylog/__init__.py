"""Delivery-log adapter tests."""
