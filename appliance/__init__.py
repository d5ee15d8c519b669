"""appliance package."""
