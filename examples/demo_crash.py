"""`make demo-crash`: kill the payments worker in the middle of a charge, restart it, and
show from the provider's ledger that every order was charged exactly once.

1. An embedded broker and orders on ``orders``; the payment provider is a SQLite file.
2. The worker runs until a charge has gone through at the provider but its result is
   not journaled yet (a latch file parks it there), then gets SIGKILL: no cleanup, no
   commit, no flush.
3. A new worker takes over. The interrupted charge's journal slot is PENDING, so the
   reconciler asks the provider instead of charging again; charges whose results were
   journaled are replayed; the rest run.
4. The ledger must hold exactly one charge per charged order. Exit code 1 otherwise.
"""

from __future__ import annotations

import collections
import random
import sqlite3
import sys
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

from agents_stream.runtime.embedded import EmbeddedBroker  # noqa: E402
from agents_stream.testing.process import WorkerProcess  # noqa: E402
from agents_stream.testing.topics import create_topics, produce, wait_for_records  # noqa: E402

ORDERS = 12
CRASH_AFTER = 4  # charges that complete before the one the worker dies in
WAIT_LINES = (" of app payments ", "joining consumer group", "joined group", "; ready")


def main() -> int:
    random.seed(11)
    customers = ["c-ada", "c-bob", "c-cyd", "c-dee"]
    orders = [
        (c, {"order": f"o-{i}", "customer": c, "amount": round(random.uniform(5, 80), 2)})
        for i, c in enumerate(random.choice(customers) for _ in range(ORDERS))
    ]
    with tempfile.TemporaryDirectory() as tmp_name:
        tmp = Path(tmp_name)
        ledger, latch = tmp / "provider-ledger.sqlite", tmp / "latch"
        latch.mkdir()
        env = {"PAYMENTS_LEDGER": str(ledger), "PAYMENTS_CRASH_LATCH": str(latch)}
        with EmbeddedBroker(log_file=tmp / "broker.log") as broker:
            print(f"embedded broker on {broker.url}; provider ledger {ledger}")
            create_topics(broker.bootstrap, ["orders"], partitions=3)

            def worker(n: int) -> WorkerProcess:
                return WorkerProcess(
                    "examples.payments:app",
                    broker=broker.url,
                    data_dir=tmp / f"data-{n}",  # a new machine: its cache is rebuilt
                    log_file=tmp / f"worker-{n}.log",
                    env=env,
                    cwd=ROOT,
                ).start()

            first = worker(1)
            produce(broker.bootstrap, "orders", orders[:CRASH_AFTER])
            wait_for_records(broker.bootstrap, "receipts", CRASH_AFTER, timeout=60)
            before = len(_charges(ledger))
            (latch / "park-charge").touch()
            produce(broker.bootstrap, "orders", orders[CRASH_AFTER:])
            parked = latch / "parked-charge"
            deadline = time.monotonic() + 60
            while not parked.exists():
                if time.monotonic() > deadline or not first.alive:
                    print(first.log(), file=sys.stderr)
                    raise SystemExit("the worker never reached the charge latch")
                time.sleep(0.05)
            time.sleep(0.5)  # the other customers' orders reach the latch too
            in_flight = _charges(ledger)[before:]
            first.kill()
            # Orders of different customers (keys) run concurrently, one per customer at
            # a time: every customer with an order in flight parked in its charge.
            print(
                f"\nSIGKILL worker {first.proc.pid if first.proc else '?'} with "
                f"{len(in_flight)} charge(s) parked after the provider took the money and "
                "before the result was journaled (one per customer with an order in flight: "
                "other keys run concurrently):"
            )
            for call_id, customer, amount in in_flight:
                print(f"  {customer} {amount:8.2f}  {call_id}")
            print(
                "Each has PENDING in the journal (written before the charge started), so the "
                "next worker runs the reconciler, which finds the charge at the provider, "
                "instead of charging again.\n"
            )
            (latch / "park-charge").unlink()

            second = worker(2)
            try:
                receipts = wait_for_records(broker.bootstrap, "receipts", ORDERS, timeout=90)
            except TimeoutError:
                print(second.log(), file=sys.stderr)
                raise
            time.sleep(1.0)  # late duplicates of receipts (outputs are at-least-once)
            second.terminate()
            # What the new worker waited for between its start and its first record: the
            # group join (the killed member's session must expire first) and the rebuild.
            print("the new worker's log, from its start to ready:")
            for line in second.log().splitlines():
                if any(w in line for w in WAIT_LINES):
                    print(f"  {line}")
            print()
        return report(orders, receipts, ledger)


def _charges(ledger: Path) -> list[tuple[str, str, float]]:
    with sqlite3.connect(ledger) as db:
        return db.execute("SELECT call_id, customer, amount FROM charges ORDER BY id").fetchall()


def report(orders: list, receipts: list, ledger: Path) -> int:
    by_order = {r.json()["order"]: r.json() for r in receipts}
    with sqlite3.connect(ledger) as db:
        charges = collections.Counter(
            call_id for (call_id,) in db.execute("SELECT call_id FROM charges")
        )
        reconciled = {c for (c,) in db.execute("SELECT call_id FROM reconciles WHERE found")}
    print(f"{'order':<6} {'customer':<8} {'amount':>7} {'status':<9} {'charges':>7}  note")
    wrong = 0
    for _, order in orders:
        receipt = by_order.get(order["order"], {})
        charge_id = receipt.get("charge_id")
        n = charges.get(charge_id, 0) if charge_id else 0
        expected = 1 if receipt.get("status") == "charged" else 0
        wrong += n != expected
        note = "in flight at the kill: reconciled, not charged again" if charge_id in reconciled else ""
        print(
            f"{order['order']:<6} {order['customer']:<8} {order['amount']:>7.2f} "
            f"{receipt.get('status', 'missing'):<9} {n:>7}  {note}"
        )
    stray = set(charges) - {r.get("charge_id") for r in by_order.values()}
    if wrong or stray or len(by_order) != len(orders):
        print(f"\nFAILED: {wrong} orders charged other than once, {len(stray)} unknown charges")
        return 1
    print(
        f"\nevery order charged exactly once ({sum(charges.values())} charges in the ledger; "
        f"the {len(reconciled)} in flight at the kill were reconciled from their PENDING "
        "slots, the ones journaled before it replayed, the rest charged once by the new worker)"
    )
    return 0


if __name__ == "__main__":
    sys.exit(main())
