"""The worker host: consumer loop, execution controller, commits, DLQ, rebalances."""
