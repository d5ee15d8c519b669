"""tests package."""
