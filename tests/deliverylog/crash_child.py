"""Child process for the SIGKILL test: emits numbered events forever, printing each index once it is flushed."""

import sys

from appliance.broker.model import Message
from appliance.deliverylog import DeliveryLog

from .conftest import BOOT


def main() -> None:
    directory, run, segment_bytes, mode = sys.argv[1], sys.argv[2], int(sys.argv[3]), sys.argv[4]
    log = DeliveryLog(directory, fleet="f", device="d", node="n1", firmware="1", boot_id=BOOT, clock_synced=True,
                      segment_bytes=segment_bytes, budget_bytes=1 << 30, flush_interval_s=0.01,
                      process=mode == "process")
    i = 0
    while True:
        for _ in range(37):
            if i % 2:  # keyword and positional (the broker's hot path) events interleaved in every batch
                log.emit("delivered", msg_id=f"{run}-{i}", subscriber=f"s{i % 5}", attempt=1, dup=False)
            else:
                log.delivered(Message(f"{run}-{i}", "t", b"", 1, False, "p", 0.0), f"s{i % 5}", 1, False, 1)
            i += 1
        log.flush()
        print(i - 1, flush=True)


if __name__ == "__main__":
    main()
