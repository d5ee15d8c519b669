"""Browse one mDNS service type for a few seconds from inside a namespace, print each instance found as JSON.

python -m tests.cluster.mdns_probe _mqtt._tcp.local. 5
"""

from __future__ import annotations

import asyncio
import json
import sys

from zeroconf import IPVersion, ServiceStateChange, Zeroconf
from zeroconf.asyncio import AsyncServiceBrowser, AsyncServiceInfo, AsyncZeroconf

from appliance.cluster.discovery import local_ipv4_addresses


async def main(service_type: str, seconds: float) -> None:
    azc = AsyncZeroconf(interfaces=local_ipv4_addresses(), ip_version=IPVersion.V4Only)
    names: set[str] = set()

    def changed(zeroconf: Zeroconf, service_type: str, name: str, state_change: ServiceStateChange) -> None:
        if state_change is ServiceStateChange.Added:
            names.add(name)

    browser = AsyncServiceBrowser(azc.zeroconf, [service_type], handlers=[changed])
    await asyncio.sleep(seconds)
    for name in sorted(names):
        info = AsyncServiceInfo(service_type, name)
        await info.async_request(azc.zeroconf, 2000)
        props = {k.decode(): (v or b"").decode() for k, v in info.properties.items()}
        print(json.dumps({"name": name, "port": info.port, "addresses": info.parsed_addresses(), "txt": props}))
    await browser.async_cancel()
    await azc.async_close()


if __name__ == "__main__":
    asyncio.run(main(sys.argv[1], float(sys.argv[2])))
