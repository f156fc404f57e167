"""`make demo`: embedded broker, the payments worker, sample orders, printed receipts.

Everything started here is stopped on exit.
"""

from __future__ import annotations

import random
import sys
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

from agents_stream.runtime.embedded import EmbeddedBroker  # noqa: E402
from agents_stream.testing.process import WorkerProcess  # noqa: E402
from agents_stream.testing.topics import create_topics, produce, wait_for_records  # noqa: E402

ORDERS = 20


def main() -> int:
    random.seed(7)
    customers = ["c-ada", "c-bob", "c-cyd"]
    orders = [
        (c, {"order": f"o-{i}", "customer": c, "amount": round(random.uniform(5, 80), 2)})
        for i, c in enumerate(random.choice(customers) for _ in range(ORDERS))
    ]
    with tempfile.TemporaryDirectory() as tmp, EmbeddedBroker(log_file=Path(tmp) / "broker.log") as broker:
        print(f"embedded broker on {broker.url}")
        create_topics(broker.bootstrap, ["orders"], partitions=3)
        worker = WorkerProcess(
            "examples.payments:app",
            broker=broker.url,
            data_dir=Path(tmp) / "data",
            log_file=Path(tmp) / "worker.log",
            env={"PAYMENTS_LEDGER": str(Path(tmp) / "provider-ledger.sqlite")},
            cwd=ROOT,
        )
        with worker:
            print(f"worker started (pid {worker.proc.pid}); producing {ORDERS} orders to 'orders'")
            produce(broker.bootstrap, "orders", orders)
            started = time.monotonic()
            try:
                receipts = wait_for_records(broker.bootstrap, "receipts", ORDERS, timeout=60)
            except TimeoutError:
                print(worker.log(), file=sys.stderr)
                raise
            print(f"{len(receipts)} receipts in {time.monotonic() - started:.1f}s:\n")
            print(f"{'customer':<8} {'order':<6} {'amount':>7} {'status':<9} {'risk':>5} {'total':>8}")
            for r in sorted(receipts, key=lambda r: (r.key, int(r.json()["order"][2:]))):
                v = r.json()
                print(
                    f"{v['customer']:<8} {v['order']:<6} {v['amount']:>7.2f} {v['status']:<9} "
                    f"{v['risk']:>5.2f} {v.get('customer_total', 0):>8.2f}"
                )
        print("\nworker stopped; log tail:")
        print("\n".join(worker.log().strip().splitlines()[-3:]))
    print("broker stopped")
    return 0


if __name__ == "__main__":
    sys.exit(main())
