"""Edge MQTT appliance: a clustered, crash-safe MQTT broker node."""

__version__ = "0.1.0"
