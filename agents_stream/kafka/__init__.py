"""Thin confluent-kafka wrappers: client configs, topic admin, an acking producer."""
