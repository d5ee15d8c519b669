"""deliverylog package."""
