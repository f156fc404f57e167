"""Command line: ``agents-stream <command>``; each command group lives in its own module."""
