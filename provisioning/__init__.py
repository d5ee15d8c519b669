"""provisioning package."""
