"""Real-client tests run against a real broker process: ours and Debian's mosquitto."""

from tests.support.fixtures import broker, micropython

__all__ = ["broker", "micropython"]
