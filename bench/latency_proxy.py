"""An HTTP proxy that adds a fixed delay to every request before passing it on, as a real object store's latency.

    python bench/latency_proxy.py --upstream http://127.0.0.1:9023 --delay_ms 20
    STORAGE_EMULATOR_HOST=http://127.0.0.1:<its port> beam-etl convert --input gs://bkt/photos/ ...

Each request sleeps `delay_ms` on its own thread, so concurrent requests overlap their delays
as they do against a real store (which answers in parallel); one client waiting on one request
at a time pays the full delay every time.
"""

import argparse
import os
import sys
import threading

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))

from tests.store_proxy import StoreProxy as LatencyProxy  # noqa: E402  (one proxy: it counts, too)


def main(argv=None):
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--upstream", required=True, help="http://host:port of the emulator")
    p.add_argument("--delay_ms", type=float, default=20.0)
    p.add_argument("--port", type=int, default=0)
    args = p.parse_args(argv)
    proxy = LatencyProxy(args.upstream, args.delay_ms, args.port)
    print(f"STORAGE_EMULATOR_HOST={proxy.url}  # {args.delay_ms:g} ms per request to {args.upstream}", flush=True)
    try:
        threading.Event().wait()
    except KeyboardInterrupt:
        proxy.close()


if __name__ == "__main__":
    main()
